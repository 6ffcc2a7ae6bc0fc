"""CudaKernel on a real GPU.

Source and PTX kernels against their NumPy reference, compile errors with their log, and
launch shapes or args that the validator or the driver refuses.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.cuda_samples import SAXPY, SAXPY_PTX
from vramfabric.kernels import CudaKernel, KernelArgumentError, KernelCompileError, ModuleCache

cupy = pytest.importorskip("cupy")


def _has_device() -> bool:
    try:
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


pytestmark = pytest.mark.skipif(not _has_device(), reason="no CUDA device")

ARGS = ("in", "out", ("f32", 2.5), "in_bytes")
MAX_FLOATS = 4096


def saxpy_reference(xp: ModuleType, data: bytes) -> bytes:
    """2.5 x + 1 over the chunk's float32s."""
    x = xp.frombuffer(data, dtype=xp.float32)
    return bytes((x * xp.float32(2.5) + xp.float32(1.0)).astype(xp.float32).tobytes())


def saxpy(**changes: Any) -> CudaKernel:
    fields: dict[str, Any] = dict(
        name="saxpy",
        entry="saxpy",
        grid=(8, 1, 1),  # fewer threads than floats: the grid-stride loop covers the rest
        block=(128, 1, 1),
        args=ARGS,
        max_output_bytes=4 * MAX_FLOATS,
        max_input_bytes=4 * MAX_FLOATS,
        source=SAXPY,
        reference=saxpy_reference,
    )
    fields.update(changes)
    return CudaKernel(**fields)


def chunk(n: int) -> bytes:
    return np.random.default_rng(n).standard_normal(n).astype(np.float32).tobytes()


def as_floats(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.float32)


@pytest.mark.parametrize("code", ["source", "ptx"])
@pytest.mark.parametrize("n", [0, 1, 1000, MAX_FLOATS])
def test_saxpy_matches_its_reference(code: str, n: int) -> None:
    # Given the saxpy from CUDA source or from PTX
    kernel = saxpy() if code == "source" else saxpy(source="", ptx=SAXPY_PTX)
    data = chunk(n)
    # When it runs on the GPU, on a non-blocking stream as executors run it
    with cupy.cuda.Stream(non_blocking=True):
        out = kernel.launch(cupy, data, ModuleCache())
    # Then the whole out buffer equals the reference's padded output
    assert len(out) == kernel.max_output_bytes
    np.testing.assert_allclose(
        as_floats(out), as_floats(kernel.run_reference(np, data)), rtol=1e-6, atol=1e-6
    )


def test_source_and_ptx_compile_once_per_process() -> None:
    modules = ModuleCache()
    for kernel in (saxpy(), saxpy(source="", ptx=SAXPY_PTX)):
        assert modules.function(kernel) is modules.function(kernel)
        kernel.launch(cupy, chunk(10), modules)


def test_a_compile_error_carries_the_compiler_log() -> None:
    bad = SAXPY.replace("+ 1.0f", "+ undeclared_token_xyz")
    with pytest.raises(KernelCompileError, match="NVRTC could not compile") as info:
        saxpy(source=bad).launch(cupy, chunk(4), ModuleCache())
    assert "undeclared_token_xyz" in info.value.log


def test_a_missing_entry_is_a_compile_error() -> None:
    with pytest.raises(KernelCompileError, match="no entry 'nope'"):
        saxpy(entry="nope").launch(cupy, chunk(4), ModuleCache())


def test_broken_ptx_is_a_compile_error() -> None:
    broken = SAXPY_PTX.replace("fma.rn.f32", "fma.bogus.f32")
    with pytest.raises(KernelCompileError, match="the PTX did not load"):
        saxpy(source="", ptx=broken).launch(cupy, chunk(4), ModuleCache())


def test_a_block_over_the_cuda_limit_is_refused_before_any_launch() -> None:
    with pytest.raises(KernelArgumentError, match=r"block: x=2048 outside 1\.\.1024"):
        saxpy(block=(2048, 1, 1))


@pytest.mark.parametrize("code", ["source", "ptx"])
def test_args_that_do_not_match_the_kernel_are_refused(code: str) -> None:
    base = {} if code == "source" else {"source": "", "ptx": SAXPY_PTX}
    with pytest.raises(KernelArgumentError, match="takes 4 parameters, args has 3"):
        saxpy(args=ARGS[:3], **base)
    with pytest.raises(KernelArgumentError, match=r"args\[2\]"):
        saxpy(args=("in", "out", ("f64", 2.5), "in_bytes"), **base)


def test_a_block_over_the_kernels_launch_bounds_is_refused_by_the_driver() -> None:
    # Given a kernel compiled for at most 64 threads per block
    bounded = SAXPY.replace("void saxpy", "void __launch_bounds__(64) saxpy")
    kernel = saxpy(source=bounded, block=(128, 1, 1))
    # Then a 128-thread launch is refused as a launch error, and the context stays usable
    with pytest.raises(KernelArgumentError, match="the driver refused"):
        kernel.launch(cupy, chunk(16), ModuleCache())
    saxpy().launch(cupy, chunk(16), ModuleCache())


def test_more_shared_memory_than_the_gpu_has_is_refused() -> None:
    with pytest.raises(KernelArgumentError, match="shared_mem_bytes"):
        saxpy(shared_mem_bytes=16 * 2**20).launch(cupy, chunk(4), ModuleCache())
