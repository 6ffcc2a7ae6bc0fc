"""The compile check: NVRTC compiles a CUDA kernel's source for each target architecture.

With CUDA's headers on the include path (cuda_headers.py), and ptxas's resource report
checked against the launch (nvrtc_limits.py: shared memory, registers). It needs no GPU and
no driver, only the `cuda` extra (`nvidia-cuda-nvrtc-cu12`,
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

import attrs

from .cuda_headers import cuda_include
from .errors import KernelArgumentError, KernelCompileError
from .host_cache import HostCache
from .nvrtc_limits import limit_problem, ptxas_error, ptxas_usage

log = logging.getLogger(__name__)

# "kernel.cu(12): error: expected a ";"" -> line 12 and the message.
_ERROR = re.compile(r"^(?P<file>[^\s()]+)\((?P<line>\d+)\): (?:catastrophic )?error: (?P<what>.*)$")
_NAME_MAP = "__nv_name_map"  # NVRTC's file name for the entry lookup it appends
_MANGLED = "_Z"
_lock = threading.Lock()
_checked: dict[tuple[str, ...], CudaSourceError | None] = {}
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
    name: str,
    source: str,
    entry: str,
    archs: Sequence[str],
    cache: HostCache | None = None,
    threads: int = 0,
    shared_mem_bytes: int = 0,
    include: str = "",
) -> bool:
    """Compile `source` for each of `archs`; False if NVRTC is not installed (nothing checked).

    With `threads` (a block's) and `shared_mem_bytes`, ptxas's report of the entry must fit
    them on each architecture. `include`: CUDA's include folder (else looked for).

    Raises:
        CudaSourceError: it does not compile for an architecture, has no `entry`, or needs
            more shared memory or registers than an architecture gives the launch.
    """
    nvrtc = nvrtc_module()
    if nvrtc is None:
        return False
    launch = _Launch(cuda_include(include), threads, shared_mem_bytes)
    key = (hashlib.sha256(source.encode()).hexdigest(), entry, *archs, repr(launch))
    with _lock:
        if key not in _checked:
            _checked[key] = _verdict(nvrtc, name, source, entry, archs, cache, launch)
        failure = _checked[key]
    if failure is not None:
        raise CudaSourceError(str(failure), failure.log)
    return True


@attrs.frozen
class _Launch:
    """What the check needs beside the source: CUDA's headers, and the launch's resources."""

    include: Path | None
    threads: int
    shared_mem_bytes: int


def _verdict(
    nvrtc: Any,
    name: str,
    source: str,
    entry: str,
    archs: Sequence[str],
    cache: HostCache | None,
    launch: _Launch,
) -> CudaSourceError | None:
    """The first failure, or None: from a pass kept in `cache`, else compiled (and kept)."""
    if cache is None:
        return _first_failure(nvrtc, name, source, entry, archs, launch)

    def compile_all(path: Path) -> None:
        failure = _first_failure(nvrtc, name, source, entry, archs, launch)
        if failure is not None:
            raise failure
        path.write_bytes(b"")

    try:
        cache.make(_marker(nvrtc, source, entry, archs, launch), compile_all)
    except CudaSourceError as exc:
        return exc
    return None


def _marker(nvrtc: Any, source: str, entry: str, archs: Sequence[str], launch: _Launch) -> str:
    """The file name of a pass: NVRTC's version, the source, the entry, archs and launch."""
    _, major, minor = nvrtc.nvrtcVersion()
    key = f"{major}.{minor}\0{source}\0{entry}\0{tuple(archs)}\0{launch!r}"
    return f"nvrtc-{hashlib.sha256(key.encode()).hexdigest()[:32]}.ok"


def _first_failure(
    nvrtc: Any, name: str, source: str, entry: str, archs: Sequence[str], launch: _Launch
) -> CudaSourceError | None:
    for arch in archs:
        try:
            _compile(nvrtc, name, source, entry, arch, launch)
        except CudaSourceError as exc:
            return exc
    log.debug("nvrtc compiled kernel=%s archs=%s", name, ",".join(archs))
    return None


def _compile(nvrtc: Any, name: str, source: str, entry: str, arch: str, launch: _Launch) -> None:
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], [])
    _ok(nvrtc, err, "nvrtcCreateProgram")
    try:
        # The entry as an address expression: NVRTC then says if it is missing, and gives
        # the symbol name a GPU would look up (a mangled entry as its demangled address).
        mangled = entry.startswith(_MANGLED)
        expression = (f"&{entry}" if not mangled else _demangled(entry)).encode()
        if expression:
            _ok(nvrtc, nvrtc.nvrtcAddNameExpression(prog, expression)[0], "nvrtcAddName")
        options = [f"--gpu-architecture={arch}".encode(), b"--ptxas-options=-v"]
        if launch.include is not None:
            options.append(f"--include-path={launch.include}".encode())
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        text = _log(nvrtc, prog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise _compile_error(name, entry, arch, text, launch)
        symbol = entry
        if expression:
            err, lowered = nvrtc.nvrtcGetLoweredName(prog, expression)
            _ok(nvrtc, err, "nvrtcGetLoweredName")
            symbol = lowered.decode()
            if symbol != entry:
                fix = 'declare it extern "C"' if not mangled else "check the mangled name"
                raise CudaSourceError(
                    f"{name}: entry {entry!r} is a C++ name (its symbol is {symbol}): {fix}"
                )
        usage = ptxas_usage(text, symbol)
        problem = usage and limit_problem(usage, arch, launch.threads, launch.shared_mem_bytes)
        if usage is not None and problem:
            raise CudaSourceError(f"{name}: {problem} [ptxas {arch}: {usage.line}]", text)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _demangled(entry: str) -> str:
    """`&name<args>` for a mangled entry, or "" when it does not demangle to a function."""
    from .host_unit import demangle

    text = demangle(entry)
    if text == entry or "(" not in text:
        return ""
    head = text[: text.index("(")] if "<" not in text else text[: text.rindex(">") + 1]
    return "&" + head.removeprefix("void ").strip()


def _compile_error(name: str, entry: str, arch: str, text: str, launch: _Launch) -> CudaSourceError:
    errors = [m for m in map(_ERROR.match, text.splitlines()) if m]
    if not errors:
        ptxas = ptxas_error(text)
        if ptxas is not None:
            return CudaSourceError(f"{name}: ptxas error: {ptxas} [nvrtc {arch}]", text)
        return CudaSourceError(f"{name}: NVRTC could not compile it for {arch}", text)
    if "could not open source file" in errors[0]["what"] and launch.include is None:
        more = (
            " (no CUDA headers found: pip install nvidia-cuda-runtime-cu12, or set "
            "VRAMFABRIC_CUDA_INCLUDE)"
        )
        first = errors[0]
        return CudaSourceError(
            f"{name}: line {first['line']}: error: {first['what']}{more} [nvrtc {arch}]", text
        )
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
