"""Compiling and loading a CudaKernel's module on a GPU, once per process and device.

CUDA C++ goes through NVRTC (CuPy's RawModule); PTX is loaded with cuModuleLoadData. Driver
statuses that mean "this kernel is bad" become KernelCompileError or KernelArgumentError;
any other CUDA error propagates, since it may have poisoned the context.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

import attrs

from .errors import KernelArgumentError, KernelCompileError

if TYPE_CHECKING:
    from .cuda_shape import CudaShape

# Driver statuses of a launch the driver refused (a bad shape or too many resources): the
# context stays usable. INVALID_VALUE, LAUNCH_OUT_OF_RESOURCES.
LAUNCH_REFUSED = frozenset({1, 701})
# Statuses of a module that did not load: INVALID_IMAGE, NO_BINARY_FOR_GPU, INVALID_PTX,
# JIT_COMPILER_NOT_FOUND, UNSUPPORTED_PTX_VERSION, INVALID_SOURCE, NOT_FOUND (no such entry).
_LOAD_FAILED = frozenset({200, 209, 218, 221, 222, 300, 500})
_MAX_DYNAMIC_SHARED_ATTRIBUTE = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_DEFAULT_SHARED_LIMIT = 48 * 1024  # above this a kernel must opt in to dynamic shared memory


@attrs.define
class ModuleCache:
    """Loaded kernel functions by (digest, device) for one process, shared by its threads.

    `cupy` defaults to the installed CuPy, imported on first use.
    """

    cupy: ModuleType | None = None
    _entries: dict[tuple[str, int], Any] = attrs.field(init=False, factory=dict)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def function(self, kernel: CudaShape) -> Any:
        """The kernel's launchable function on the current device, compiled on first use.

        Raises:
            KernelCompileError: it did not compile or load, or has no such entry; the failure
                is remembered, so a bad kernel is not compiled again for every chunk.
            KernelArgumentError: the GPU cannot give it `shared_mem_bytes`.
        """
        cupy = self.cupy if self.cupy is not None else _import_cupy()
        key = (kernel.digest, int(cupy.cuda.runtime.getDevice()))
        # One lock for every kernel: threads starting the same new kernel wait for one
        # compile instead of each running NVRTC.
        with self._lock:
            if key not in self._entries:
                try:
                    self._entries[key] = _load(cupy, kernel)
                except KernelCompileError as exc:
                    self._entries[key] = exc
            entry = self._entries[key]
        if isinstance(entry, KernelCompileError):
            raise KernelCompileError(str(entry), entry.log)
        return entry


def _import_cupy() -> ModuleType:
    import cupy

    return cupy  # type: ignore[no-any-return]


def _load(cupy: Any, kernel: CudaShape) -> Any:
    """Compile (source) or load (PTX) the module, look up the entry, allow its shared memory."""
    try:
        if kernel.source:
            function = cupy.RawModule(code=kernel.source).get_function(kernel.entry)
            handle = function.kernel.ptr
        else:
            # CuPy 13's RawModule takes PTX only as a file path; Module.load is the
            # cuModuleLoadData that CuPy itself uses for NVRTC's PTX, and needs no temp file.
            module = cupy.cuda.function.Module()
            module.load(kernel.ptx.encode())
            function = module.get_function(kernel.entry)
            handle = function.ptr
    except cupy.cuda.compiler.CompileException as exc:
        raise KernelCompileError(f"{kernel.name}: NVRTC could not compile it", str(exc)) from None
    except cupy.cuda.driver.CUDADriverError as exc:
        if exc.status not in _LOAD_FAILED:
            raise
        raise KernelCompileError(_load_failure(kernel, exc.status), str(exc)) from None
    if kernel.shared_mem_bytes > _DEFAULT_SHARED_LIMIT:
        _allow_shared_memory(cupy, kernel, handle)
    return function


def _allow_shared_memory(cupy: Any, kernel: CudaShape, handle: int) -> None:
    """Opt the function in to more dynamic shared memory than the default 48 KiB."""
    try:
        cupy.cuda.driver.funcSetAttribute(
            handle, _MAX_DYNAMIC_SHARED_ATTRIBUTE, kernel.shared_mem_bytes
        )
    except cupy.cuda.driver.CUDADriverError as exc:
        if exc.status not in LAUNCH_REFUSED:
            raise
        raise KernelArgumentError(
            f"{kernel.name}: shared_mem_bytes={kernel.shared_mem_bytes} is more than this "
            f"GPU allows: {exc}"
        ) from None


def _load_failure(kernel: CudaShape, status: int) -> str:
    if status == 500:  # CUDA_ERROR_NOT_FOUND from cuModuleGetFunction
        return (
            f"{kernel.name}: no entry {kernel.entry!r} in the module (a C++ kernel needs "
            'extern "C", or give its mangled name)'
        )
    return f"{kernel.name}: the {'PTX' if kernel.ptx else 'compiled module'} did not load"
