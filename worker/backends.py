"""Execution backends: NumPy on a simulated GPU, CuPy on a real one, each capped at the slice."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from vramfabric.broker.errors import (
    KernelLaunchFailed,
    KernelLoadFailed,
    KernelNotFound,
    SliceVramExceeded,
)
from vramfabric.kernels import Kernel, KernelArgumentError, KernelMissing, Registry


class Backend(Protocol):
    """Runs one kernel call on one GPU within one slice's VRAM."""

    name: str

    async def run(
        self, kernel: Kernel, args: Mapping[str, Any], data: bytes, gpu: int, slice_bytes: int
    ) -> bytes:
        """Run `kernel` on `data`; raise a vramfabric error on failure."""
        ...

    def close(self) -> None:
        """Release threads and device memory."""
        ...


def lookup(registry: Registry, name: str, digest: str) -> Kernel:
    """The registry's kernel, with the lookup failure mapped to KernelNotFound."""
    try:
        return registry.get_kernel(name, digest)
    except KernelMissing as exc:
        raise KernelNotFound(str(exc.args[0])) from None


class NumpyBackend:
    """Runs kernels' NumPy references in a thread pool: the simulated GPU.

    The slice cap is enforced up front from the kernel's declared working set, since
    NumPy has no memory pool to limit.
    """

    name = "numpy"

    def __init__(self, n_threads: int = 1) -> None:
        """Create the pool; one thread keeps the event loop responsive beside it."""
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=n_threads, thread_name_prefix="vf-numpy"
        )

    async def run(
        self, kernel: Kernel, args: Mapping[str, Any], data: bytes, gpu: int, slice_bytes: int
    ) -> bytes:
        """Run the reference on NumPy after checking the slice can hold its working set."""
        need = kernel.vram_bytes(len(data))
        if need > slice_bytes:
            raise SliceVramExceeded(limit_bytes=slice_bytes, requested_bytes=need)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, kernel.run, np, args, data)
        except KernelArgumentError as exc:
            raise KernelLaunchFailed(str(exc)) from None
        except MemoryError:
            raise SliceVramExceeded(limit_bytes=slice_bytes, requested_bytes=need) from None

    def close(self) -> None:
        """Stop the thread pool."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class CupyBackend:
    """Runs kernels on a real GPU with CuPy, each call's allocations capped at its slice."""

    name = "cupy"

    def __init__(self) -> None:
        """Import CuPy now so a node without it fails at start, not on its first chunk."""
        try:
            import cupy
        except ImportError as exc:
            msg = f"cupy is not installed: pip install vramfabric[gpu] ({exc})"
            raise KernelLoadFailed(msg) from None
        self._cupy = cupy
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="vf-cupy"
        )

    def _call(
        self, kernel: Kernel, args: Mapping[str, Any], data: bytes, gpu: int, slice_bytes: int
    ) -> bytes:
        cupy = self._cupy
        pool = cupy.cuda.MemoryPool()
        pool.set_limit(size=slice_bytes)
        # using_allocator is thread-local: the cap applies to this call and nothing else.
        with cupy.cuda.Device(gpu), cupy.cuda.using_allocator(pool.malloc):
            try:
                return kernel.run(cupy, args, data)
            except cupy.cuda.memory.OutOfMemoryError:
                need = kernel.vram_bytes(len(data))
                raise SliceVramExceeded(limit_bytes=slice_bytes, requested_bytes=need) from None
            finally:
                pool.free_all_blocks()

    async def run(
        self, kernel: Kernel, args: Mapping[str, Any], data: bytes, gpu: int, slice_bytes: int
    ) -> bytes:
        """Run the kernel on GPU `gpu` in a pool limited to `slice_bytes`."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._pool, self._call, kernel, args, data, gpu, slice_bytes
            )
        except KernelArgumentError as exc:
            raise KernelLaunchFailed(str(exc)) from None

    def close(self) -> None:
        """Stop the worker thread."""
        self._pool.shutdown(wait=False, cancel_futures=True)
