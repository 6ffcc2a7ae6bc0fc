"""The translation unit g++ compiles for the host path: the kernel's source, rewritten.

What changes in the source, at offsets read from `code_only` (so nothing in a comment or a
string is touched): each `__shared__` variable is registered after its declaration, so that
it is poisoned at every block's start; `extern __shared__` arrays point at the block's
dynamic shared memory (at file scope, through a macro, since there is no block when a
global is initialised). Line numbers are kept. Then the launcher: `vf_run` launches the
entry, named as written or by its mangled C++ name (demangled into a typed address).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess

from .cuda_text import SharedDecl, code_only, shared_declarations
from .errors import KernelCompileError

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_STATIC = re.compile(r"\bstatic\b")
_MANGLED = re.compile(r"_Z\w+")
# A kernel that calls any of these runs every thread as a fiber of its own.
_FIBER_WORDS = re.compile(
    r"\b(__syncthreads\w*|__shfl\w*_sync|__ballot_sync|__any_sync|__all_sync|__syncwarp"
    r"|__reduce_\w+_sync|__match_\w+_sync|__activemask)\b"
)
# Headers a CUDA source may include that g++ does not have: cuda_host.h defines what they do.
STUB_HEADERS = {
    name: "#pragma once\n"
    for name in (
        "cuda_fp16.h",
        "cuda_bf16.h",
        "cuda_runtime.h",
        "cuda.h",
        "device_launch_parameters.h",
        "device_functions.h",
        "sm_60_atomic_functions.h",
        "vector_types.h",
        "vector_functions.h",
    )
}
STUB_HEADERS["math_constants.h"] = """#pragma once
#define CUDART_PI_F 3.141592654f
#define CUDART_PI 3.1415926535897931e+0
#define CUDART_2PI_F 6.283185307f
#define CUDART_PIO2_F 1.570796327f
#define CUDART_INF_F __int_as_float(0x7f800000)
#define CUDART_NAN_F __int_as_float(0x7fffffff)
#define CUDART_INF __longlong_as_double(0x7ff0000000000000ULL)
#define CUDART_NAN __longlong_as_double(0xfff8000000000000ULL)
#define CUDART_SQRT_2_F 1.414213562f
#define CUDART_LN2_F 0.693147181f
#define CUDART_L2E_F 1.442695041f
#define CUDART_MAX_NORMAL_F 3.40282347e+38f
"""


def uses_fibers(code: str) -> bool:
    """Whether the kernel synchronises threads (barriers or warp intrinsics)."""
    return _FIBER_WORDS.search(code) is not None


def translation_unit(name: str, source: str, entry: str) -> str:
    """The source as g++ compiles it: the header, the rewritten source as kernel.cu, the launcher.

    Raises:
        KernelCompileError: the entry is neither an identifier nor a mangled name that demangles.
    """
    code = code_only(source)
    declarations = shared_declarations(code)
    body, macros = _rewrite(source, declarations)
    file_shared = [n for d in declarations if d.file_scope and not d.dynamic for n in d.names]
    registered = "".join(f'  vf::register_shared(&{n}, sizeof({n}), "{n}");\n' for n in file_shared)
    fibers = "vf::F_FIBERS" if uses_fibers(code) else "0u"
    return (
        '#include "cuda_host.h"\n'
        + "".join(macros)
        + '#line 1 "kernel.cu"\n'
        + f"{body}\n"
        + '#line 1 "vf_launcher.cpp"\n'
        + f"static void vf_file_shared() {{\n{registered}}}\n"
        + "VF_EXPORT int vf_run(const unsigned* grid, const unsigned* block, "
        "unsigned long long shared_bytes, void** argv, unsigned flags, char* text, "
        "unsigned text_bytes) {\n"
        f"  return vf::launch({entry_expression(name, entry)}, grid, block, shared_bytes, argv, "
        f"flags | {fibers}, text, text_bytes, vf_file_shared);\n}}\n"
    )


def _rewrite(source: str, declarations: list[SharedDecl]) -> tuple[str, list[str]]:
    pieces, macros, last = [], [], 0
    for d in declarations:
        if d.dynamic:
            name, element = d.names[-1], d.element_type or "unsigned char"
            pointer = f"reinterpret_cast<{element}*>(__vf_dynamic_shared())"
            kept_lines = "\n" * source.count("\n", d.start, d.end)
            pieces.append(source[last : d.start])
            if d.file_scope:
                macros.append(f"#define {name} ({pointer})\n")
                pieces.append(kept_lines)
            else:
                pieces.append(f"{element}* const {name} = {pointer};{kept_lines}")
        else:
            # `static __shared__` would be `static static thread_local`: the macro says static.
            pieces.append(source[last : d.start])
            pieces.append(_STATIC.sub(_blank, source[d.start : d.shared_at]))
            pieces.append(source[d.shared_at : d.end])
            if not d.file_scope:
                pieces.append("".join(f" VF_SHARED({n})" for n in d.names))
        last = d.end
    pieces.append(source[last:])
    return "".join(pieces), macros


def _blank(match: re.Match[str]) -> str:
    return " " * len(match[0])


def entry_expression(name: str, entry: str) -> str:
    """The C++ expression of the entry's address: as written, or demangled with its type.

    Raises:
        KernelCompileError: neither an identifier nor a mangled name c++filt understands.
    """
    if _MANGLED.fullmatch(entry):
        return _demangled_address(name, entry)
    if _IDENTIFIER.fullmatch(entry):
        return entry
    raise KernelCompileError(f"{name}: entry {entry!r} is not a C identifier or a mangled name")


def _demangled_address(name: str, entry: str) -> str:
    text = demangle(entry)
    if text == entry or not text.endswith(")"):
        raise KernelCompileError(f"{name}: entry {entry!r} is not a mangled function name")
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            function, params = text[:i], text[i + 1 : -1]
            break
    else:
        raise KernelCompileError(f"{name}: entry {entry!r} demangles to {text!r}")
    if function.startswith("void "):  # a template's demangled name carries its return type
        function = function[len("void ") :]
    return f"static_cast<void (*)({params})>(&{function})"


@functools.cache
def demangle(symbol: str) -> str:
    """`symbol` demangled by c++filt (binutils, beside g++), or as given if it cannot be."""
    tool = shutil.which("c++filt")
    if tool is None:
        return symbol
    done = subprocess.run([tool, symbol], capture_output=True, text=True, timeout=30, check=False)
    return done.stdout.strip() or symbol
