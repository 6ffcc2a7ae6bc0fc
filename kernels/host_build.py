"""Building a CUDA kernel's source for the host: scan, rewrite (host_unit.py), g++, cache by key.

Two builds of a source: the plain one (`-O2`, line tables for fault reports) that chunks
run, and the check build (`check=True`: `-fsanitize=thread` instrumentation without its
runtime, so the hooks of cuda_host_check.h see every memory access) that check mode runs.
A library is built once per source, entry, headers, flags and compiler, into a HostCache
(host_cache.py): found in the node's built-ins folder or the process's own, else built by
one process while the others that need it wait. A failed build is kept too (a `.err` file
beside where the library would be, and in this process), so a kernel g++ refuses fails
every later chunk at once instead of compiling again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import shutil
import subprocess
import tempfile
import threading
from importlib import resources
from pathlib import Path

from .cuda_text import code_only, line_of
from .errors import KernelCompileError
from .host_cache import HostCache
from .host_unit import STUB_HEADERS, translation_unit

log = logging.getLogger(__name__)

COMPILER = "g++"
HEADERS = (
    "cuda_host.h",
    "cuda_host_types.h",
    "cuda_host_math.h",
    "cuda_host_state.h",
    "cuda_host_warps.h",
    "cuda_host_faults.h",
    "cuda_host_run.h",
    "cuda_host_check.h",
)
# Line tables for fault reports, in DWARF 4: binutils 2.40 names the wrong file for DWARF 5
# line tables under #line. No _FORTIFY_SOURCE: its longjmp check refuses leaving a fiber.
_COMMON: tuple[str, ...] = ("-std=c++17", "-fPIC", "-fno-strict-aliasing", "-fvisibility=hidden")
_COMMON += ("-g1", "-gdwarf-4", "-U_FORTIFY_SOURCE", "-w")
_FLAGS = (*_COMMON, "-O2")
# Instrumented for the hooks, linked without ThreadSanitizer's runtime (cuda_host_check.h).
_CHECK_FLAGS: tuple[str, ...] = (*_COMMON, "-O1", "-DVF_CHECK", "-fsanitize=thread")
_CHECK_FLAGS += ("-fno-omit-frame-pointer",)
_CHECK_FLAGS += ("--param", "tsan-instrument-func-entry-exit=0")
_TIMEOUT_S = 300.0
# What the host path cannot run: a pattern, the name it is refused under, and words one of
# which the pattern needs (a plain `in` first: the regexes alone took 0.19 s over the 630 KB
# hyperparam source, for every process that loads it).
_UNSUPPORTED = (
    (re.compile(r"cooperative_groups"), "cooperative groups", ("cooperative_groups",)),
    (
        re.compile(r"\b(wmma|nvcuda|mma_sync)\b|<mma\.h>"),
        "tensor cores (wmma/mma)",
        ("wmma", "nvcuda", "mma"),
    ),
    (re.compile(r"\basm\s*(volatile\s*)?\("), "inline PTX (asm)", ("asm",)),
    (
        re.compile(r"\b(tex[123]D\w*|surf[123]D\w*|texture\s*<|cudaTextureObject_t)"),
        "textures and surfaces",
        ("tex", "surf", "cudaTextureObject_t"),
    ),
    (re.compile(r"<<<"), "dynamic parallelism (<<<...>>> in device code)", ("<<<",)),
)
_ERROR = re.compile(r"^kernel\.cu:(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<what>.*)$")
_lock = threading.Lock()
_failed: dict[str, KernelCompileError] = {}


class HostUnsupported(KernelCompileError):
    """The kernel uses a CUDA feature the host path cannot run."""


class NoHostCompiler(KernelCompileError):
    """This machine has no g++, so the host path cannot build anything."""


def check_supported(name: str, source: str) -> None:
    """Refuse a source using a feature the host path lacks, naming the feature and its line.

    Comments and strings are not code: a usage comment `// k<<<4, 64>>>(...)` is no launch.

    Raises:
        HostUnsupported: naming the first such feature.
    """
    code: str | None = None
    for pattern, feature, words in _UNSUPPORTED:
        if not any(w in source for w in words):
            continue
        code = code if code is not None else code_only(source)
        found = pattern.search(code)
        if found:
            raise HostUnsupported(
                f"{name}: line {line_of(code, found.start())}: {found.group(0)!r}: the host path "
                f"cannot run {feature}; run this kernel on a GPU worker"
            )


def host_source(source: str, entry: str) -> str:
    """The translation unit g++ compiles (host_unit.py)."""
    return translation_unit(entry, source, entry)


def build(name: str, source: str, entry: str, cache: HostCache, check: bool = False) -> Path:
    """The shared library of `source` for the host (the check build if `check`), built once.

    Raises:
        HostUnsupported: the source uses a feature the host path lacks.
        NoHostCompiler: there is no g++ here.
        KernelCompileError: g++ failed (the message names the line), now or before.
    """
    unit = translation_unit(name, source, entry)
    library = library_name(unit, check)
    with _lock:
        failed = _failed.get(library)
    if failed is not None:
        raise KernelCompileError(str(failed), failed.log)
    # A library in the cache passed the scan when it was built (the rules are in its key).
    found = cache.find(library)
    if found is not None:
        return found
    try:
        check_supported(name, source)
        _known_failure(cache, library)
        return cache.make(library, lambda path: _compile(name, unit, path, check))
    except NoHostCompiler:
        raise
    except KernelCompileError as exc:
        with _lock:
            _failed[library] = exc
        _keep_failure(cache, library, exc)
        raise


def library_name(unit: str, check: bool = False) -> str:
    """The cache's file name of a translation unit's library (headers and compiler included)."""
    rules = [feature for _, feature, _ in _UNSUPPORTED]
    flags = _CHECK_FLAGS if check else _FLAGS
    text = f"{_headers()}\0{unit}\0{flags}\0{_compiler()}\0{rules}"
    key = hashlib.sha256(text.encode()).hexdigest()
    return f"{key[:32]}{'-check' if check else ''}.so"


def _known_failure(cache: HostCache, library: str) -> None:
    found = cache.find(f"{library}.err")
    if found is None:
        return
    try:
        kept = json.loads(found.read_text())
        failure = KernelCompileError(str(kept["message"]), str(kept["log"]))
    except (OSError, ValueError, KeyError, TypeError):
        return  # unreadable: build again
    raise failure


def _keep_failure(cache: HostCache, library: str, exc: KernelCompileError) -> None:
    text = json.dumps({"message": str(exc), "log": exc.log})
    try:
        cache.make(f"{library}.err", lambda path: path.write_text(text))
    except (OSError, KernelCompileError) as kept:  # recorded in this process all the same
        log.warning("host build failure not kept on disk: %s", kept)


def _compile(name: str, unit: str, library: Path, check: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="vf-host-") as work:
        folder = Path(work)
        for header, text in {**_header_files(), **STUB_HEADERS}.items():
            (folder / header).write_text(text)
        (folder / "unit.cpp").write_text(unit)
        include = ["-I", work]
        if check:
            # Instrumented, then linked without -fsanitize (no ThreadSanitizer runtime).
            obj = folder / "unit.o"
            steps = [
                [COMPILER, *_CHECK_FLAGS, *include, "-c", "-o", str(obj), str(folder / "unit.cpp")],
                [COMPILER, "-shared", "-o", str(library), str(obj)],
            ]
        else:
            unit_file = str(folder / "unit.cpp")
            steps = [[COMPILER, *_FLAGS, "-shared", *include, "-o", str(library), unit_file]]
        for command in steps:
            done = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S)
            if done.returncode != 0:
                raise _compile_error(name, done.stderr)
    log.info("host kernel built kernel=%s library=%s", name, library.name)


def _compile_error(name: str, stderr: str) -> KernelCompileError:
    errors = [m for m in map(_ERROR.match, stderr.splitlines()) if m]
    if not errors:
        return KernelCompileError(f"{name}: g++ could not compile it for the host path", stderr)
    first = errors[0]
    return KernelCompileError(
        f"{name}: line {first['line']}: error: {first['what']} [host g++]", stderr
    )


@functools.cache
def _header_files() -> dict[str, str]:
    folder = resources.files(__package__)
    return {name: (folder / name).read_text() for name in HEADERS}


def _headers() -> str:
    return "\0".join(_header_files().values()) + "\0" + repr(sorted(STUB_HEADERS.items()))


@functools.cache
def _compiler() -> str:
    """g++'s version line (part of the cache key).

    Raises:
        NoHostCompiler: no g++ on this machine.
    """
    if shutil.which(COMPILER) is None:
        raise NoHostCompiler(f"no {COMPILER} on this worker: the host path needs one")
    done = subprocess.run([COMPILER, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0] if done.stdout else COMPILER
