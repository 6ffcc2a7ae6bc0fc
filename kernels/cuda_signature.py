"""A CUDA entry's parameters, read from its C++ or PTX signature.

They let validation catch args that do not fit before a launch reads garbage (or faults
and poisons the context). A signature that cannot be read with confidence (templates,
macros, overloads) gives None: it is not checked, and the compiler has the last word.
"""

from __future__ import annotations

import re

import attrs

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_PTX_TYPE = re.compile(r"\.[busf](8|16|32|64)\b")
_PTX_ARRAY = re.compile(r"\[(\d+)\]")
_C_QUALIFIERS = re.compile(r"\b(?:const|volatile|__restrict__|__restrict|restrict)\b")
# A scalar C type's size and kind: "f" float, "i" signed, "u" unsigned integer (LP64).
_C_TYPES = {"float": (4, "f"), "double": (8, "f"), "int": (4, "i"), "signed": (4, "i")}
_C_TYPES |= {"signed int": (4, "i"), "unsigned": (4, "u"), "unsigned int": (4, "u")}
_C_TYPES |= {"int32_t": (4, "i"), "uint32_t": (4, "u"), "int64_t": (8, "i"), "uint64_t": (8, "u")}
_C_TYPES |= {"size_t": (8, "u"), "ptrdiff_t": (8, "i"), "long": (8, "i"), "long int": (8, "i")}
_C_TYPES |= {"unsigned long": (8, "u"), "unsigned long int": (8, "u"), "long long": (8, "i")}
_C_TYPES |= {"long long int": (8, "i"), "unsigned long long": (8, "u")}
_C_TYPES |= {"unsigned long long int": (8, "u"), "uint": (4, "u"), "ulong": (8, "u")}


@attrs.frozen
class Param:
    """One kernel parameter: pointer or not, and its size, where the text tells."""

    text: str
    pointer: bool | None
    size: int | None
    kind: str | None = None  # "f", "i" or "u" for a scalar whose C type is known


def ptx_params(ptx: str, entry: str) -> list[Param] | None:
    """The parameters of `.entry <entry>` in PTX, or None if it is not found."""
    pattern = r"\.entry\s+" + re.escape(entry) + r"\s*\(([^)]*)\)"
    match = re.search(pattern, _COMMENTS.sub(" ", ptx))
    if match is None:
        return None
    params = []
    for text in (t.strip() for t in match.group(1).split(",") if t.strip()):
        bits, count = _PTX_TYPE.search(text), _PTX_ARRAY.search(text)
        size = int(bits.group(1)) // 8 * (int(count.group(1)) if count else 1) if bits else None
        # A PTX pointer is a plain .u64: only the size can be checked.
        params.append(Param(" ".join(text.split()), None, size))
    return params


def source_params(source: str, entry: str) -> list[Param] | None:
    """The parameters of `__global__ void <entry>(...)` in CUDA C++, or None if unsure."""
    pattern = (
        r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
        + re.escape(entry)
        + r"\s*\(([^()]*)\)"
    )
    found = {" ".join(m.split()) for m in re.findall(pattern, _COMMENTS.sub(" ", source))}
    # Zero or two different signatures (overloads, #if branches), or template arguments
    # whose commas break the split: leave it to the compiler.
    if len(found) != 1 or "<" in next(iter(found)):
        return None
    body = found.pop()
    if body in ("", "void"):
        return []
    return [_c_param(text.strip()) for text in body.split(",")]


def _c_param(text: str) -> Param:
    if "*" in text or "[" in text:
        return Param(text, True, 8)
    words = _C_QUALIFIERS.sub(" ", text).split()
    size, kind = _C_TYPES.get(" ".join(words[:-1]), (None, None))
    # An unknown type may be a typedef of a pointer: then nothing is checked.
    return Param(text, False if size else None, size, kind)
