"""Running a CudaKernel's CUDA source on the CPU (the host path of simulated GPUs).

The source is built with g++ under cuda_host.h (host_build.py), loaded once per process
with ctypes, and launched over the bytes and launch shape a GPU gets: the chunk copied into
`in`, a zeroed `max_output_bytes` `out` (both ending at a guard page), `in_bytes` and the
scalars, each passed as a pointer to its bytes (cuLaunchKernel's kernelParams). One launch
runs on the calling thread. What the launch finds wrong (a fault, a divergent barrier, a
warp intrinsic's mask, in the check build a race) raises KernelFault naming the line.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from .cuda_checks import IN_BYTES
from .errors import KernelArgumentError, KernelCompileError
from .host_build import build
from .host_faults import KernelFault, fault_message
from .settings import CudaSettings

if TYPE_CHECKING:
    from .cuda_shape import CudaShape

log = logging.getLogger(__name__)

# Launch flags (cuda_host_run.h): blocks and threads in reverse order; the other poison
# pattern; record accesses (the check build only); no printf (a check's second run).
REVERSE, POISON_B, CHECK, QUIET = 1, 2, 4, 16
_REPORT_BYTES = 2048
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
# Loaded libraries by (id of the source text, entry, check, builtin, caches), with the text
# itself kept (so the id stays its own): rewriting and hashing a 600 KB source again per
# checked chunk cost 0.3 s.
_loaded: dict[tuple[object, ...], tuple[str, HostLibrary]] = {}


@attrs.frozen
class HostLibrary:
    """A kernel's loaded host library: where it is, and its entry points."""

    path: Path
    buffers: Any
    launch: Any
    done: Any
    check: bool


def launcher(
    kernel: CudaShape,
    settings: CudaSettings | None = None,
    builtin: bool = False,
    check: bool = False,
) -> HostLibrary:
    """The kernel's host library (the check build if `check`), built and loaded on first use.

    A `builtin` (a registered kernel's CUDA version: the node's own code) is built in the
    node's built-ins folder where this uid may write it, beside the agent's prebuild.

    Raises:
        HostUnsupported: the source uses a feature the host path lacks.
        KernelCompileError: there is no source (PTX), or g++ is missing or failed.
    """
    if not kernel.source:
        raise KernelCompileError(f"{kernel.name}: the host path runs CUDA source, not PTX")
    settings = settings or CudaSettings.from_env()
    key = (id(kernel.source), kernel.entry, check, builtin, settings.cache())
    with _lock:
        known = _loaded.get(key)
    if known is not None and known[0] is kernel.source:
        return known[1]
    cache = settings.builtins_cache() if builtin else settings.cache()
    # One lock: threads starting the same new kernel wait for one g++, not one each.
    with _lock:
        path = build(kernel.name, kernel.source, kernel.entry, cache, check=check)
        if path not in _libraries:
            try:
                _libraries[path] = ctypes.CDLL(str(path))
            except OSError as exc:
                raise KernelCompileError(
                    f"{kernel.name}: the host library did not load: {exc}"
                ) from None
        library = _libraries[path]
    buffers, launch, done = library.vf_buffers, library.vf_run, library.vf_done
    buffers.restype = launch.restype = ctypes.c_int
    pointer = ctypes.POINTER(ctypes.c_void_p)
    buffers.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong, pointer, pointer]
    launch.argtypes = [
        ctypes.POINTER(ctypes.c_uint),
        ctypes.POINTER(ctypes.c_uint),
        ctypes.c_ulonglong,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_uint,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    done.restype = None
    done.argtypes = []
    loaded = HostLibrary(path, buffers, launch, done, check)
    with _lock:
        _loaded[key] = (kernel.source, loaded)
    return loaded


def run_host(kernel: CudaShape, data: bytes, library: HostLibrary, flags: int = 0) -> bytes:
    """Launch the kernel's grid on the CPU over `data` with its library; return `out` whole.

    Raises:
        KernelArgumentError: the input is too large, or the launch could not be set up.
        KernelFault: the kernel faulted, or broke a rule of CUDA the host path checks.
    """
    if len(data) > kernel.max_input_bytes:
        raise KernelArgumentError(
            f"{kernel.name}: input of {len(data)} bytes exceeds "
            f"max_input_bytes={kernel.max_input_bytes}"
        )
    # An empty chunk still gets a real (1-byte) buffer, as on a GPU: never a null pointer.
    in_bytes = max(len(data), 1)
    inp, out = ctypes.c_void_p(), ctypes.c_void_p()
    if library.buffers(in_bytes, kernel.max_output_bytes, ctypes.byref(inp), ctypes.byref(out)):
        raise KernelArgumentError(f"{kernel.name}: no memory for `in` and `out` on the host path")
    assert inp.value is not None and out.value is not None
    ctypes.memmove(inp.value, data or b"\0", in_bytes)
    named: dict[str, Any] = {"in": ctypes.c_void_p(inp.value), "out": ctypes.c_void_p(out.value)}
    named[IN_BYTES] = ctypes.c_uint64(len(data))
    values = [named[a] if isinstance(a, str) else _CTYPES[a[0]](a[1]) for a in kernel.args]
    argv = (ctypes.c_void_p * max(len(values), 1))(*(ctypes.addressof(v) for v in values))
    grid = (ctypes.c_uint * 3)(*kernel.grid)
    block = (ctypes.c_uint * 3)(*kernel.block)
    report = ctypes.create_string_buffer(_REPORT_BYTES)
    status = library.launch(
        grid, block, kernel.shared_mem_bytes, argv, flags, report, _REPORT_BYTES
    )
    if status == 1:
        raise KernelArgumentError(f"{kernel.name}: {report.value.decode(errors='replace')}")
    if status != 0:
        text = report.value.decode(errors="replace")
        fault = KernelFault(fault_message(kernel.name, text, library.path))
        if "past the end" in text and not library.check:
            # A guard page saw the first byte past the end: the check build sees the access
            # whole, and names its size.
            raise _measured(kernel, data) or fault
        raise fault
    result = ctypes.string_at(out.value, kernel.max_output_bytes)
    library.done()
    return result


def _measured(kernel: CudaShape, data: bytes) -> KernelFault | None:
    """The check build's report of the chunk's fault, or None if it has none to give."""
    try:
        run_host(kernel, data, launcher(kernel, check=True), CHECK | QUIET)
    except KernelFault as exc:
        return exc
    except KernelCompileError:  # no check build: the guard page's report stands
        return None
    return None
