"""Reading CUDA source as code: comments and string literals blanked, braces counted.

Every scan of a kernel's source (features the host path refuses, barriers, `__shared__`
declarations) reads `code_only(source)`, the source with the text of comments and string and
character literals replaced by spaces: same length and same lines, so an offset found there
is the same offset in the source, and a usage comment such as `// k<<<4, 64>>>(...)` is never
taken for code.
"""

from __future__ import annotations

import re

import attrs

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_SHARED = re.compile(r"\b__shared__\b")
_OPEN, _CLOSE = "([{", ")]}"


def code_only(source: str) -> str:
    """`source` with comments and string/char literals blanked (newlines kept)."""
    out = list(source)
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c == "/" and source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
        elif c == "/" and source.startswith("/*", i):
            end = source.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif c in "\"'" and not _raw_prefix(source, i):
            end = _literal_end(source, i, c)
        elif c == '"':  # R"delim( ... )delim"
            end = _raw_end(source, i)
        else:
            i += 1
            continue
        for j in range(i, end):
            if out[j] != "\n":
                out[j] = " "
        i = end
    return "".join(out)


def _raw_prefix(source: str, i: int) -> bool:
    return source[i] == '"' and i > 0 and source[i - 1] == "R"


def _literal_end(source: str, i: int, quote: str) -> int:
    j = i + 1
    while j < len(source):
        if source[j] == "\\":
            j += 2
            continue
        if source[j] == quote or source[j] == "\n":
            return j + 1
        j += 1
    return len(source)


def _raw_end(source: str, i: int) -> int:
    paren = source.find("(", i)
    if paren < 0:
        return _literal_end(source, i, '"')
    closing = ")" + source[i + 1 : paren] + '"'
    end = source.find(closing, paren)
    return len(source) if end < 0 else end + len(closing)


def line_of(source: str, offset: int) -> int:
    """The 1-based line of `offset`."""
    return source.count("\n", 0, offset) + 1


def depths(code: str) -> list[int]:
    """The brace depth at each offset of `code` (0 at file scope)."""
    depth, found = 0, []
    for c in code:
        if c == "}":
            depth = max(depth - 1, 0)
        found.append(depth)
        if c == "{":
            depth += 1
    return found


@attrs.frozen
class SharedDecl:
    """A `__shared__` declaration: where its statement ends, its names, its scope."""

    end: int  # offset just past its `;`
    names: tuple[str, ...]
    file_scope: bool
    dynamic: bool  # extern __shared__ T name[];
    start: int  # offset of the statement's first token
    element_type: str  # for a dynamic one: T
    shared_at: int = 0  # offset of the `__shared__` keyword


def shared_declarations(code: str) -> list[SharedDecl]:
    """Every `__shared__` declaration in `code` (as `code_only` gives it)."""
    scope = depths(code)
    found = []
    for match in _SHARED.finditer(code):
        start = _statement_start(code, match.start())
        end = _statement_end(code, match.end())
        if end < 0:
            continue
        text = code[start : end - 1]
        dynamic = re.match(r"\s*extern\b", text) is not None
        declarators = _split_top(code[match.end() : end - 1])
        names = tuple(n for n in (_declared_name(d) for d in declarators) if n)
        element = ""
        if dynamic:
            head = re.sub(r"__align__\s*\(\s*\d+\s*\)", " ", code[match.end() : end - 1])
            typed = re.match(r"\s*(.*?)\s*([A-Za-z_]\w*)\s*\[\s*\]\s*$", head, re.DOTALL)
            element = " ".join(typed[1].split()) if typed else ""
        if names:
            file_scope = scope[match.start()] == 0
            found.append(SharedDecl(end, names, file_scope, dynamic, start, element, match.start()))
    return found


def _statement_start(code: str, at: int) -> int:
    i = at
    while i > 0 and code[i - 1] not in ";{}":
        i -= 1
    while i < at and code[i].isspace():
        i += 1
    # A preprocessor line before the statement is not part of it.
    newline = code.rfind("\n", i, at)
    if "#" in code[i:at]:
        i = newline + 1 if newline >= 0 else i
    return i


def _statement_end(code: str, at: int) -> int:
    depth = 0
    for i in range(at, len(code)):
        c = code[i]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth < 0:
                return -1
        elif c == ";" and depth == 0:
            return i + 1
    return -1


def _split_top(text: str) -> list[str]:
    parts, depth, last = [], 0, 0
    for i, c in enumerate(text):
        if c in _OPEN or c == "<":
            depth += 1
        elif c in _CLOSE or c == ">":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[last:i])
            last = i + 1
    parts.append(text[last:])
    return parts


def _declared_name(declarator: str) -> str:
    # "float tile[16][17]" -> tile; "b[4]" -> b; "__align__(16) float4 v[8]" -> v
    text = re.sub(r"\[[^\]]*\]", " ", declarator.split("=")[0])
    text = re.sub(r"__align__\s*\([^)]*\)", " ", text)
    names = _IDENTIFIER.findall(text)
    return names[-1] if names else ""
