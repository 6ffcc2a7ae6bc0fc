"""Each built-in CUDA kernel, launched on a GPU, equals its NumPy reference.

Bit for bit where the output is integer or Philox (montecarlo, tiles), else within the
tolerance its module states for a GPU's fused multiply-adds. The registered hyperparam_eval
runs hyperparam.cu through an executor's WorkRunner, on its lease's stream and pool.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest

from vramfabric.kernels import (
    CudaKernel,
    ModuleCache,
    builtin_registry,
    fitness,
    hyperparam,
    inference,
    montecarlo,
    tiles,
)
from vramfabric.kernels.code import Context
from vramfabric.worker.executor import ipc
from vramfabric.worker.executor.work_runner import WorkRunner

RNG_SEED = 1616
HYPERPARAM_RTOL = 2e-6


def on_gpu(cupy: ModuleType, kernel: CudaKernel, data: bytes, modules: ModuleCache) -> bytes:
    """Launch as an executor does: on a non-blocking stream of its own."""
    with cupy.cuda.Stream(non_blocking=True):
        return kernel.launch(cupy, data, modules)


def montecarlo_inputs(rng: np.random.Generator) -> list[bytes]:
    seeds = [0, 2**64 - 1, *rng.integers(0, 2**63, 6).tolist()]
    return [montecarlo.encode_seed(s) for s in seeds]


def inference_inputs(rng: np.random.Generator) -> list[bytes]:
    rows = [0, 1, 129, inference.MAX_ROWS]
    return [rng.standard_normal((n, inference.N_IN)).astype(np.float32).tobytes() for n in rows]


def tiles_inputs(rng: np.random.Generator) -> list[bytes]:
    return [tiles.encode_tile(int(c), int(r)) for c, r in rng.integers(0, 8, (6, 2))]


def fitness_inputs(rng: np.random.Generator) -> list[bytes]:
    sizes = [0, 1, 100, fitness.MAX_POPULATION]
    return [
        rng.uniform(-5.12, 5.12, (n, fitness.N_GENES)).astype(np.float32).tobytes() for n in sizes
    ]


# name -> (kernel, reference, inputs, output dtype, (rtol, atol) or None for bit for bit)
CASES: dict[
    str,
    tuple[
        Callable[[], CudaKernel],
        Callable[..., bytes],
        Callable[..., list[bytes]],
        str,
        tuple[float, float] | None,
    ],
] = {
    "montecarlo": (montecarlo.cuda_kernel, montecarlo.reference, montecarlo_inputs, "uint64", None),
    "inference": (
        inference.cuda_kernel,
        inference.reference,
        inference_inputs,
        "float32",
        (inference.RTOL, inference.ATOL),
    ),
    "tiles": (tiles.cuda_kernel, tiles.reference, tiles_inputs, "uint32", None),
    "fitness": (
        fitness.cuda_kernel,
        fitness.reference,
        fitness_inputs,
        "float32",
        (fitness.RTOL, fitness.ATOL),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_builtin_cuda_kernel_equals_its_reference_on_a_gpu(
    cupy: ModuleType, name: str
) -> None:
    make, reference, inputs, dtype, tolerance = CASES[name]
    kernel, modules = make(), ModuleCache()
    for data in inputs(np.random.default_rng(RNG_SEED)):
        got = on_gpu(cupy, kernel, data, modules)
        want = reference(np, data).ljust(kernel.max_output_bytes, b"\0")
        if tolerance is None:
            assert got == want
        else:
            np.testing.assert_allclose(
                np.frombuffer(got, dtype), np.frombuffer(want, dtype), *tolerance
            )


def test_the_hyperparam_kernel_finds_the_demos_best_configuration_on_a_gpu(
    cupy: ModuleType,
) -> None:
    kernel, modules = hyperparam.cuda_kernel(), ModuleCache()
    configs = hyperparam.search_space(1000)
    losses = [
        np.frombuffer(on_gpu(cupy, kernel, hyperparam.encode_config(*c), modules), np.float32)[0]
        for c in configs
    ]
    want = [
        np.frombuffer(hyperparam.reference(np, {}, hyperparam.encode_config(*c)), np.float32)[0]
        for c in configs
    ]
    np.testing.assert_allclose(losses, want, rtol=HYPERPARAM_RTOL)
    assert int(np.argmin(losses)) == int(np.argmin(want)) == 996


def test_an_executor_runs_the_registered_hyperparam_kernel_from_its_cuda_source(
    cupy: ModuleType,
) -> None:
    # Given a GPU executor's runner and a lease
    runner = WorkRunner(builtin_registry, simulated=False)
    kernel = hyperparam.HYPERPARAM_EVAL
    ctx = Context(device=0, slice_bytes=2**30, xp=cupy, attempt=1, job="j", index=0)
    for config in hyperparam.search_space(1000)[990:]:
        data = hyperparam.encode_config(*config)
        frame = ipc.Run(
            kind="builtin",
            name=kernel.name,
            digest=kernel.digest,
            input=data,
            slice_bytes=2**30,
            lease="lease-1",
            job="j",
            index=0,
            attempt=1,
        )
        # When it runs a chunk, Then hyperparam.cu (compiled once) gives the reference's loss
        out = np.frombuffer(runner.execute(frame, ctx), np.float32)
        np.testing.assert_allclose(
            out, np.frombuffer(kernel.run(np, {}, data), np.float32), rtol=HYPERPARAM_RTOL
        )
    assert len(runner.modules._entries) == 1
