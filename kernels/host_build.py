"""Building a CUDA kernel's source for the host: scan, wrap in cuda_host.h, g++, cache by key.

The library is built once per source, entry, header and compiler, into a HostCache
(host_cache.py): found in the node's built-ins folder or the process's own, else built by one
process while the others that need it wait.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from .cuda_compile import KernelCompileError
from .host_cache import HostCache

log = logging.getLogger(__name__)

COMPILER = "g++"
_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-fno-strict-aliasing")
_TIMEOUT_S = 300.0
# What the host path cannot run: a pattern, the name it is refused under, and words one of
# which the pattern needs (a plain `in` first: the regexes alone took 0.19 s over the 630 KB
# hyperparam source, for every process that loads it).
_UNSUPPORTED = (
    (
        re.compile(r"\b__(shfl\w*|ballot\w*|any_sync|all_sync|activemask|syncwarp|match_\w+)\b"),
        "warp intrinsics (__shfl*, __ballot*, __any/__all_sync, __activemask, __syncwarp)",
        ("__shfl", "__ballot", "_sync", "__activemask", "__match_"),
    ),
    (re.compile(r"\b__reduce_\w+_sync\b"), "warp reductions (__reduce_*_sync)", ("__reduce_",)),
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
    (
        re.compile(r"\b(__half\d?|__nv_bfloat16\d?)\b|cuda_fp16|cuda_bf16"),
        "half and bfloat16",
        ("half", "bfloat16", "cuda_fp16", "cuda_bf16"),
    ),
)
_ERROR = re.compile(r"^kernel\.cu:(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<what>.*)$")
_DYNAMIC_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_][\w\s]*?)\s*(\w+)\s*"
    r"\[\s*\]\s*;"
)
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


class HostUnsupported(KernelCompileError):
    """The kernel uses a CUDA feature the host path cannot run."""


class NoHostCompiler(KernelCompileError):
    """This machine has no g++, so the host path cannot build anything."""


def check_supported(name: str, source: str) -> None:
    """Refuse a source using a feature the host path lacks, naming the feature and its line.

    Raises:
        HostUnsupported: naming the first such feature.
    """
    for pattern, feature, words in _UNSUPPORTED:
        found = any(w in source for w in words) and pattern.search(source)
        if found:
            line = source.count("\n", 0, found.start()) + 1
            raise HostUnsupported(
                f"{name}: line {line}: {found.group(0)!r}: the host path cannot run {feature}; "
                "run this kernel on a GPU worker"
            )


def host_source(source: str, entry: str) -> str:
    """The translation unit g++ compiles: the header, the source as kernel.cu, the launcher."""
    # extern __shared__ arrays (declared in the kernel) point at the block's dynamic memory.
    body = _DYNAMIC_SHARED.sub(
        lambda m: f"{m[1]}* const {m[2]} = reinterpret_cast<{m[1]}*>(__vf_dynamic_shared());",
        source,
    )
    barriers = "true" if "__syncthreads" in source else "false"
    return (
        '#include "cuda_host.h"\n#line 1 "kernel.cu"\n'
        f"{body}\n"
        '#line 1 "vf_launcher.cpp"\n'
        'extern "C" int vf_launch(const unsigned* grid, const unsigned* block, '
        "unsigned long long shared_bytes, void** argv) {\n"
        f"  return vf::launch({entry}, grid, block, shared_bytes, argv, {barriers});\n}}\n"
    )


def build(name: str, source: str, entry: str, cache: HostCache) -> Path:
    """The shared library of `source` for the host, compiled on first use.

    Raises:
        HostUnsupported: the source uses a feature the host path lacks.
        NoHostCompiler: there is no g++ here.
        KernelCompileError: g++ failed (the message names the line).
    """
    if not _IDENTIFIER.fullmatch(entry):
        raise HostUnsupported(f"{name}: entry {entry!r} is not a C identifier")
    unit = host_source(source, entry)
    library = library_name(unit)
    # A library in the cache passed the scan when it was built (the rules are in its key).
    found = cache.find(library)
    if found is not None:
        return found
    check_supported(name, source)
    return cache.make(library, lambda path: _compile(name, unit, path))


def library_name(unit: str) -> str:
    """The cache's file name of a translation unit's library (header and compiler included)."""
    rules = [feature for _, feature, _ in _UNSUPPORTED]
    text = f"{_header()}\0{unit}\0{_FLAGS}\0{_compiler()}\0{rules}"
    key = hashlib.sha256(text.encode()).hexdigest()
    return f"{key[:32]}.so"


def _compile(name: str, unit: str, library: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="vf-host-") as work:
        folder = Path(work)
        (folder / "cuda_host.h").write_text(_header())
        (folder / "unit.cpp").write_text(unit)
        command = [COMPILER, *_FLAGS, "-I", work, "-o", str(library), str(folder / "unit.cpp")]
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
def _header() -> str:
    return (resources.files(__package__) / "cuda_host.h").read_text()


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
