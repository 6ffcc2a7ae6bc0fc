"""The compile check: NVRTC compiles a CUDA kernel's source for each target architecture.

It needs no GPU and no driver, only the `cuda` extra (`nvidia-cuda-nvrtc-cu12`,
`cuda-bindings`). Without it the check is skipped, with one warning per process. Results
are cached per source, entry and architectures, so a kernel is compiled once per process;
with a HostCache a pass is also kept on disk (one empty file), so the executors of a node
(and later runs) do not each compile a kernel that passed once. Failures are not kept there.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .cuda_compile import KernelCompileError
from .host_cache import HostCache
from .kernel import KernelArgumentError

log = logging.getLogger(__name__)

# "kernel.cu(12): error: expected a ";"" -> line 12 and the message.
_ERROR = re.compile(r"^(?P<file>[^\s()]+)\((?P<line>\d+)\): (?:catastrophic )?error: (?P<what>.*)$")
_NAME_MAP = "__nv_name_map"  # NVRTC's file name for the entry lookup it appends
_MANGLED = "_Z"
_lock = threading.Lock()
_checked: dict[tuple[str, str, tuple[str, ...]], CudaSourceError | None] = {}
_warned: list[bool] = []


class CudaSourceError(KernelCompileError, KernelArgumentError):
    """The CUDA source does not compile (or lacks its entry); the message names the line."""


def nvrtc_module() -> ModuleType | None:
    """cuda.bindings.nvrtc, or None (warned once) when the `cuda` extra is not installed."""
    try:
        return importlib.import_module("cuda.bindings.nvrtc")
    except ImportError:
        with _lock:
            if not _warned:
                _warned.append(True)
                log.warning(
                    "nvrtc not installed: CUDA kernels are not compile-checked "
                    "(pip install 'vramfabric[cuda]')"
                )
        return None


def check_source(
    name: str, source: str, entry: str, archs: Sequence[str], cache: HostCache | None = None
) -> bool:
    """Compile `source` for each of `archs`; False if NVRTC is not installed (nothing checked).

    Raises:
        CudaSourceError: it does not compile for an architecture, or has no `entry`.
    """
    nvrtc = nvrtc_module()
    if nvrtc is None:
        return False
    key = (hashlib.sha256(source.encode()).hexdigest(), entry, tuple(archs))
    with _lock:
        if key not in _checked:
            _checked[key] = _verdict(nvrtc, name, source, entry, archs, cache)
        failure = _checked[key]
    if failure is not None:
        raise CudaSourceError(str(failure), failure.log)
    return True


def _verdict(
    nvrtc: Any, name: str, source: str, entry: str, archs: Sequence[str], cache: HostCache | None
) -> CudaSourceError | None:
    """The first failure, or None: from a pass kept in `cache`, else compiled (and kept)."""
    if cache is None:
        return _first_failure(nvrtc, name, source, entry, archs)

    def compile_all(path: Path) -> None:
        failure = _first_failure(nvrtc, name, source, entry, archs)
        if failure is not None:
            raise failure
        path.write_bytes(b"")

    try:
        cache.make(_marker(nvrtc, source, entry, archs), compile_all)
    except CudaSourceError as exc:
        return exc
    return None


def _marker(nvrtc: Any, source: str, entry: str, archs: Sequence[str]) -> str:
    """The file name of a pass: NVRTC's version, the source, the entry, the architectures."""
    _, major, minor = nvrtc.nvrtcVersion()
    key = f"{major}.{minor}\0{source}\0{entry}\0{tuple(archs)}"
    return f"nvrtc-{hashlib.sha256(key.encode()).hexdigest()[:32]}.ok"


def _first_failure(
    nvrtc: Any, name: str, source: str, entry: str, archs: Sequence[str]
) -> CudaSourceError | None:
    for arch in archs:
        try:
            _compile(nvrtc, name, source, entry, arch)
        except CudaSourceError as exc:
            return exc
    log.debug("nvrtc compiled kernel=%s archs=%s", name, ",".join(archs))
    return None


def _compile(nvrtc: Any, name: str, source: str, entry: str, arch: str) -> None:
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], [])
    _ok(nvrtc, err, "nvrtcCreateProgram")
    try:
        # The entry as an address expression: NVRTC then says if it is missing, and gives
        # the symbol name a GPU would look up (a mangled entry is looked up as written).
        expression = f"&{entry}".encode()
        lookup = not entry.startswith(_MANGLED)
        if lookup:
            _ok(nvrtc, nvrtc.nvrtcAddNameExpression(prog, expression)[0], "nvrtcAddName")
        options = [f"--gpu-architecture={arch}".encode()]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise _compile_error(name, entry, arch, _log(nvrtc, prog))
        if lookup:
            err, lowered = nvrtc.nvrtcGetLoweredName(prog, expression)
            _ok(nvrtc, err, "nvrtcGetLoweredName")
            if lowered.decode() != entry:
                raise CudaSourceError(
                    f"{name}: entry {entry!r} is a C++ name (its symbol is {lowered.decode()}): "
                    'declare it extern "C"'
                )
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_error(name: str, entry: str, arch: str, text: str) -> CudaSourceError:
    errors = [m for m in map(_ERROR.match, text.splitlines()) if m]
    if not errors:
        return CudaSourceError(f"{name}: NVRTC could not compile it for {arch}", text)
    first = errors[0]
    if first["file"] == _NAME_MAP:
        return CudaSourceError(f"{name}: no __global__ function {entry!r} in the source", text)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return CudaSourceError(
        f"{name}: line {first['line']}: error: {first['what']}{more} [nvrtc {arch}]", text
    )


def _log(nvrtc: Any, prog: Any) -> str:
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buffer = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buffer)
    return str(buffer.rstrip(b"\0").decode(errors="replace"))


def _ok(nvrtc: Any, result: Any, call: str) -> None:
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise KernelCompileError(f"{call} failed: {nvrtc.nvrtcGetErrorString(result)[1]!r}")
