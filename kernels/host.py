"""Running a CudaKernel's CUDA source on the CPU (the host path of simulated GPUs).

The source is built with g++ under cuda_host.h (host_build.py), loaded once per process
with ctypes, and launched over the bytes and launch shape a GPU gets: a copy of the chunk
as "in", a zeroed `max_output_bytes` "out", `in_bytes` and the scalars, each passed as a
pointer to its bytes (cuLaunchKernel's kernelParams). One launch runs on the calling thread.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cuda_checks import IN_BYTES
from .cuda_compile import KernelCompileError
from .host_build import build
from .kernel import KernelArgumentError
from .settings import CudaSettings

if TYPE_CHECKING:
    from .cuda import CudaKernel

log = logging.getLogger(__name__)

_CTYPES: dict[str, type[ctypes._SimpleCData]] = {  # type: ignore[type-arg]
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
    "i32": ctypes.c_int32,
    "u32": ctypes.c_uint32,
    "i64": ctypes.c_int64,
    "u64": ctypes.c_uint64,
}
_lock = threading.Lock()
_libraries: dict[Path, ctypes.CDLL] = {}


def launcher(
    kernel: CudaKernel, settings: CudaSettings | None = None, builtin: bool = False
) -> Callable[..., int]:
    """The kernel's `vf_launch`, built and loaded on first use in this process.

    A `builtin` (a registered kernel's CUDA version: the node's own code) is built in the
    node's built-ins folder where this uid may write it, beside the agent's prebuild.

    Raises:
        HostUnsupported: the source uses a feature the host path lacks.
        KernelCompileError: there is no source (PTX), or g++ is missing or failed.
    """
    if not kernel.source:
        raise KernelCompileError(f"{kernel.name}: the host path runs CUDA source, not PTX")
    settings = settings or CudaSettings.from_env()
    cache = settings.builtins_cache() if builtin else settings.cache()
    # One lock: threads starting the same new kernel wait for one g++, not one each.
    with _lock:
        path = build(kernel.name, kernel.source, kernel.entry, cache)
        if path not in _libraries:
            _libraries[path] = ctypes.CDLL(str(path))
        function: Any = _libraries[path].vf_launch
    function.restype = ctypes.c_int
    function.argtypes = [
        ctypes.POINTER(ctypes.c_uint),
        ctypes.POINTER(ctypes.c_uint),
        ctypes.c_ulonglong,
        ctypes.POINTER(ctypes.c_void_p),
    ]
    return function  # type: ignore[no-any-return]


def run_host(kernel: CudaKernel, data: bytes, function: Callable[..., int]) -> bytes:
    """Launch the kernel's grid on the CPU over `data` with its `launcher`; return `out` whole.

    Raises:
        KernelArgumentError: the input is too large, or the launch could not be set up.
    """
    if len(data) > kernel.max_input_bytes:
        raise KernelArgumentError(
            f"{kernel.name}: input of {len(data)} bytes exceeds "
            f"max_input_bytes={kernel.max_input_bytes}"
        )
    # An empty chunk still gets a real (1-byte) buffer, as on a GPU: never a null pointer.
    inp = ctypes.create_string_buffer(data or b"\0", max(len(data), 1))
    out = ctypes.create_string_buffer(kernel.max_output_bytes)
    named = {
        "in": ctypes.c_void_p(ctypes.addressof(inp)),
        "out": ctypes.c_void_p(ctypes.addressof(out)),
        IN_BYTES: ctypes.c_uint64(len(data)),
    }
    values = [named[a] if isinstance(a, str) else _CTYPES[a[0]](a[1]) for a in kernel.args]
    argv = (ctypes.c_void_p * max(len(values), 1))(*(ctypes.addressof(v) for v in values))
    grid = (ctypes.c_uint * 3)(*kernel.grid)
    block = (ctypes.c_uint * 3)(*kernel.block)
    if function(grid, block, kernel.shared_mem_bytes, argv) != 0:
        raise KernelArgumentError(
            f"{kernel.name}: no memory for block={kernel.block} on the host path"
        )
    return out.raw
