"""The built-in CUDA kernels: each compiles for sm_90 and its host-path run equals its oracle.

Bit for bit where the output is integer or Philox, else within the tolerance its module states.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_samples import FAULT
from vramfabric.kernels import CudaKernel, fitness, inference, montecarlo, nvrtc, tiles
from vramfabric.kernels.nvrtc import check_source

RNG_SEED = 1616
needs_nvrtc = pytest.mark.skipif(
    nvrtc.nvrtc_module() is None,
    reason="nvrtc not installed (pip install 'vramfabric[cuda]'; .ci/run installs it)",
)
KERNELS = {
    "montecarlo": montecarlo.cuda_kernel,
    "inference": inference.cuda_kernel,
    "tiles": tiles.cuda_kernel,
    "fitness": fitness.cuda_kernel,
}


@needs_nvrtc
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_each_builtin_kernel_compiles_for_sm_90(name: str) -> None:
    kernel: CudaKernel = KERNELS[name]()
    assert check_source(kernel.name, kernel.source, kernel.entry, ["sm_90"])


def test_philox_matches_the_random123_known_answers() -> None:
    # Known-answer vectors of Philox4x32-10 from Random123's kat_vectors.
    zero = np.zeros(1, np.uint64)
    ones = np.full(1, 0xFFFFFFFF, np.uint64)
    assert [int(w[0]) for w in montecarlo.philox4x32_10((zero,) * 4, (0, 0))] == [
        0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8,
    ]  # fmt: skip
    assert [int(w[0]) for w in montecarlo.philox4x32_10((ones,) * 4, (2**32 - 1,) * 2)] == [
        0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD,
    ]  # fmt: skip


def test_montecarlo_counts_equal_the_reference_bit_for_bit() -> None:
    # Given random 64-bit seeds (the edges included)
    rng = np.random.default_rng(RNG_SEED)
    seeds = [0, 2**64 - 1, *rng.integers(0, 2**63, 10).tolist()]
    kernel = montecarlo.cuda_kernel()
    for seed in seeds:
        data = montecarlo.encode_seed(seed)
        # When the CUDA source runs on the host, Then its counts are the reference's exactly
        assert kernel.run_host(data) == montecarlo.reference(np, data)
    hits, points = np.frombuffer(kernel.run_host(montecarlo.encode_seed(7)), np.uint64)
    assert points == montecarlo.POINTS and abs(4 * hits / points - np.pi) < 0.05


def test_montecarlo_seeds_give_different_counts() -> None:
    kernel = montecarlo.cuda_kernel()
    counts = {kernel.run_host(montecarlo.encode_seed(s)) for s in range(8)}
    assert len(counts) > 1


@pytest.mark.parametrize("rows", [0, 1, 129, inference.MAX_ROWS])
def test_inference_logits_equal_the_reference_within_tolerance(rows: int) -> None:
    x = np.random.default_rng(RNG_SEED + rows).standard_normal((rows, inference.N_IN))
    data = x.astype(np.float32).tobytes()
    out = np.frombuffer(inference.cuda_kernel().run_host(data), np.float32)
    expected = np.frombuffer(inference.reference(np, data), np.float32)
    np.testing.assert_allclose(
        out[: expected.size], expected, rtol=inference.RTOL, atol=inference.ATOL
    )
    # Rows past the chunk's stay zeroed.
    assert not out[expected.size :].any()


def test_inference_weights_follow_the_seed() -> None:
    a, b = inference.weights(1), inference.weights(2)
    assert not np.array_equal(a[0], b[0])
    assert all(np.abs(w).max() <= 0.125 for w in a)


@pytest.mark.parametrize("tile", [(0, 0), (3, 4), (7, 7), (2, 5)])
def test_mandelbrot_tiles_equal_the_reference_bit_for_bit(tile: tuple[int, int]) -> None:
    data = tiles.encode_tile(*tile)
    assert tiles.cuda_kernel().run_host(data) == tiles.reference(np, data)


def test_mandelbrot_tiles_of_random_views_equal_the_reference() -> None:
    rng = np.random.default_rng(RNG_SEED)
    for _ in range(4):
        view = (
            float(rng.uniform(-2, 0.5)),
            float(rng.uniform(-1.2, 1.2)),
            float(10 ** rng.uniform(-5, -2)),
        )
        data = tiles.encode_tile(int(rng.integers(0, 4)), int(rng.integers(0, 4)))
        kernel = tiles.cuda_kernel(view, 500)
        assert kernel.run_host(data) == tiles.reference(np, data, view, 500)


@pytest.mark.parametrize("population", [0, 1, 100, fitness.MAX_POPULATION])
def test_rastrigin_fitness_equals_the_reference_within_tolerance(population: int) -> None:
    rng = np.random.default_rng(RNG_SEED + population)
    genes = rng.uniform(-5.12, 5.12, (population, fitness.N_GENES)).astype(np.float32)
    data = genes.tobytes()
    out = np.frombuffer(fitness.cuda_kernel().run_host(data), np.float32)
    expected = np.frombuffer(fitness.reference(np, data), np.float32)
    np.testing.assert_allclose(out[: expected.size], expected, rtol=fitness.RTOL, atol=fitness.ATOL)
    # out[0] is the block reduction's minimum (+inf for an empty chunk).
    assert out[0] == (out[1 : 1 + population].min() if population else np.inf)


def test_rastrigin_is_zero_at_the_origin() -> None:
    data = np.zeros((3, fitness.N_GENES), np.float32).tobytes()
    out = np.frombuffer(fitness.cuda_kernel().run_host(data), np.float32)
    assert out[:4].tolist() == [0.0, 0.0, 0.0, 0.0]


@needs_nvrtc
def test_the_gpu_tests_faulting_sample_compiles_for_sm_90() -> None:
    # It faults when it runs, not when it compiles: the GPU test relies on that.
    assert check_source("fault", FAULT, "fault", ["sm_90"])
