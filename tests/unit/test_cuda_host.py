"""The host path (kernels/host.py): a CudaKernel's CUDA source run on the CPU equals its oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cuda_host_samples import SAMPLES
from tests.cuda_samples import SAXPY, SAXPY_PTX
from vramfabric.kernels import CudaKernel, HostUnsupported, KernelCompileError, hyperparam
from vramfabric.kernels.host_build import build, host_source, library_name
from vramfabric.kernels.host_cache import HostCache

RNG_SEED = 16
# float32 tolerance of the hyperparameter kernel against NumPy: the sums run in another
# order (measured: at most 2.3e-7 relative, about 2 ulp, over the demo's 1000 configurations).
HYPERPARAM_RTOL = 2e-6


def cuda(source: str, entry: str, args: tuple[Any, ...], **fields: Any) -> CudaKernel:
    return CudaKernel(name=entry, entry=entry, args=args, source=source, **fields)


@pytest.fixture(scope="module")
def hyperparam_kernel() -> CudaKernel:
    return hyperparam.cuda_kernel()


@pytest.mark.parametrize("n", [0, 1, 255, 1000])
def test_saxpy_on_the_host_equals_numpy_bit_for_bit(n: int) -> None:
    # Given random floats and a grid-stride SAXPY of 3 blocks
    x = np.random.default_rng(RNG_SEED).standard_normal(n).astype(np.float32)
    kernel = cuda(
        SAXPY,
        "saxpy",
        ("in", "out", ("f32", 2.5), "in_bytes"),
        grid=(3,),
        block=(64,),
        max_output_bytes=4000,
    )
    # When the source runs on the host
    out = np.frombuffer(kernel.run_host(x.tobytes()), np.float32)
    # Then the chunk's floats are a x + 1 and the rest of `out` stays zeroed
    np.testing.assert_array_equal(out[:n], np.float32(2.5) * x + np.float32(1.0))
    assert not out[n:].any()


@pytest.mark.parametrize("grid", [1, 3, 8])
def test_a_shared_memory_block_reduction_with_atomics_is_exact(grid: int) -> None:
    source, entry, block = SAMPLES["block_sum"]
    x = np.random.default_rng(RNG_SEED).integers(0, 2**32, 5000, dtype=np.uint32)
    kernel = cuda(
        source,
        entry,
        ("in", "out", "in_bytes"),
        grid=(grid,),
        block=(block,),
        max_output_bytes=8,
        output_dtype="uint64",
    )
    total = np.frombuffer(kernel.run_host(x.tobytes()), np.uint64)[0]
    assert int(total) == int(x.astype(np.uint64).sum())


def test_dynamic_shared_memory_and_the_barrier_hold_per_block() -> None:
    source, entry, block = SAMPLES["scale_dynamic"]
    x = np.random.default_rng(RNG_SEED).standard_normal(4 * block).astype(np.float32)
    kernel = cuda(
        source,
        entry,
        ("in", "out", ("f32", 2.0), "in_bytes"),
        grid=(4,),
        block=(block,),
        shared_mem_bytes=4 * block,
        max_output_bytes=x.nbytes,
    )
    out = np.frombuffer(kernel.run_host(x.tobytes()), np.float32)
    expected = (np.float32(2.0) * x).reshape(4, block)[:, ::-1].ravel()
    np.testing.assert_array_equal(out, expected)


@pytest.mark.timeout(120)
def test_the_hyperparam_cuda_source_equals_its_reference_on_random_configs(
    hyperparam_kernel: CudaKernel,
) -> None:
    rng = np.random.default_rng(RNG_SEED)
    for _ in range(25):
        config = hyperparam.encode_config(
            float(rng.uniform(1e-5, 0.05)), int(rng.integers(1, 321)), float(rng.uniform(0, 0.95))
        )
        host = np.frombuffer(hyperparam_kernel.run_host(config), np.float32)
        oracle = np.frombuffer(hyperparam.reference(np, {}, config), np.float32)
        np.testing.assert_allclose(host, oracle, rtol=HYPERPARAM_RTOL)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_hyperparam_cuda_source_finds_the_demos_best_configuration(
    hyperparam_kernel: CudaKernel,
) -> None:
    configs = [hyperparam.encode_config(*c) for c in hyperparam.search_space(1000)]
    host = [np.frombuffer(hyperparam_kernel.run_host(c), np.float32)[0] for c in configs]
    oracle = [np.frombuffer(hyperparam.reference(np, {}, c), np.float32)[0] for c in configs]
    assert int(np.argmin(host)) == int(np.argmin(oracle))
    np.testing.assert_allclose(host, oracle, rtol=HYPERPARAM_RTOL)


def test_an_invalid_hyperparam_config_gives_nan(hyperparam_kernel: CudaKernel) -> None:
    out = hyperparam_kernel.run_host(hyperparam.encode_config(0.5, 32, 0.1))
    assert np.isnan(np.frombuffer(out, np.float32)[0])


@pytest.mark.parametrize(
    ("line", "feature"),
    [
        ('asm volatile("membar.gl;");', "inline PTX"),
        ("float t = tex1Dfetch<float>(0, 0);", "textures and surfaces"),
        ("kernel<<<1, 1>>>(out);", "dynamic parallelism"),
    ],
)
def test_an_unsupported_feature_is_refused_with_its_line(
    line: str, feature: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not NVRTC's check (a device-side launch needs -rdc there): the host path's own refusal.
    monkeypatch.setenv("VRAMFABRIC_CUDA_CHECK", "0")
    source = f'extern "C" __global__ void k(float* out) {{\n  float v = 1.0f;\n  {line}\n}}\n'
    kernel = cuda(source, "k", ("out",), grid=(1,), block=(32,), max_output_bytes=4)
    with pytest.raises(HostUnsupported, match=f"line 3: .*cannot run {feature}"):
        kernel.run_host(b"")


def test_a_host_compile_error_names_the_line(tmp_path: Path) -> None:
    # NVRTC accepts it, g++ does not: the host header lacks this intrinsic.
    source = 'extern "C" __global__ void k(float* out) {\n  out[0] = __fmul_ru(2.0f, 3.0f);\n}\n'
    with pytest.raises(KernelCompileError, match=r"k: line 2: error: .*__fmul_ru"):
        build("k", source, "k", HostCache(tmp_path))
    # No library and no partial file is left behind: the (empty) locks, and the failure kept.
    library = library_name_of(source)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{library}.err",
        f"{library}.err.lock",
        f"{library}.lock",
    ]


def library_name_of(source: str) -> str:
    return library_name(host_source(source, "k"))


def test_a_ptx_kernel_runs_its_reference_on_the_host_path() -> None:
    kernel = CudaKernel(
        name="saxpy",
        entry="saxpy",
        grid=(1,),
        block=(32,),
        ptx=SAXPY_PTX,
        args=("in", "out", ("f32", 2.0), "in_bytes"),
        max_output_bytes=8,
        reference=lambda xp, data: (xp.frombuffer(data, xp.float32) * 2 + 1).tobytes(),
    )
    out = kernel.run_host(np.array([1, 2], np.float32).tobytes())
    np.testing.assert_array_equal(np.frombuffer(out, np.float32), [3, 5])
