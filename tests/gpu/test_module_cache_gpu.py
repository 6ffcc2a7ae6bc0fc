"""Modules are compiled once per process and digest, however many threads ask at once."""

from __future__ import annotations

import concurrent.futures
from types import ModuleType

import pytest

from tests.cuda_samples import SAXPY
from vramfabric.kernels import CudaKernel, KernelCompileError, ModuleCache


def saxpy(source: str = SAXPY, a: float = 2.5) -> CudaKernel:
    return CudaKernel(
        name="saxpy",
        entry="saxpy",
        grid=(1,),
        block=(64,),
        args=("in", "out", ("f32", a), "in_bytes"),
        max_output_bytes=256,
        source=source,
    )


def test_threads_asking_for_one_new_kernel_get_one_compiled_function(cupy: ModuleType) -> None:
    modules = ModuleCache()
    kernel = saxpy()

    def function() -> object:
        with cupy.cuda.Device(0):
            return modules.function(kernel)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        functions = list(pool.map(lambda _: function(), range(64)))
    assert len({id(f) for f in functions}) == 1 and len(modules._entries) == 1


def test_another_digest_is_another_module(cupy: ModuleType) -> None:
    modules = ModuleCache()
    first, second = saxpy(a=2.5), saxpy(a=3.5)  # the same source, other args: other digests
    assert first.digest != second.digest
    assert modules.function(first) is not modules.function(second)
    assert len(modules._entries) == 2


def test_a_kernel_that_does_not_compile_is_compiled_once(cupy: ModuleType) -> None:
    # PTX is not checked when the kernel is built: the driver refuses it when it loads.
    modules = ModuleCache()
    kernel = saxpy()
    broken = CudaKernel(
        name="broken",
        entry="saxpy",
        grid=(1,),
        block=(1,),
        args=kernel.args,
        max_output_bytes=4,
        ptx=".version 7.0\n.target sm_80\n.address_size 64\nbroken\n",
    )
    for _ in range(3):
        with pytest.raises(KernelCompileError, match="did not load"):
            modules.function(broken)
    assert isinstance(modules._entries[(broken.digest, 0)], KernelCompileError)
