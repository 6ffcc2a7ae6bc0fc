"""What the host path found wrong with a kernel while it ran, as a message naming its lines.

The launcher writes a report with the addresses of the instructions at fault as
`@pc:OFFSET@` (an offset into the kernel's library); addr2line (binutils, beside g++) turns
each into the kernel.cu line it was compiled from, through inlined frames.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

from .errors import KernelArgumentError

# An address, or alternatives (the first that is a kernel.cu line wins).
_PC = re.compile(r"@pc:([0-9a-f|]+)@")
_KERNEL_LINE = re.compile(r"kernel\.cu:(\d+)")


class KernelFault(KernelArgumentError):
    """The kernel did something a GPU would not run right: the message names it and its line.

    A bad address, a race, a divergent barrier, a read of shared memory never written, a
    division by zero, a stack overflow. A permanent failure of the chunk (`launch_failed`).
    """


class KernelRace(KernelFault):
    """The kernel's output depends on the order its threads or blocks run in."""


def fault_message(kernel: str, report: str, library: Path) -> str:
    """`report` with its `@pc:...@` addresses as lines, prefixed with the kernel's name."""
    text = _PC.sub(lambda m: _where(library, [int(a, 16) for a in m[1].split("|")]), report)
    joiner = " " if text.startswith(("wrote ", "read ")) else ": "
    return f"kernel {kernel}{joiner}{text}"


def _where(library: Path, offsets: list[int]) -> str:
    for offset in offsets:
        line = kernel_line(str(library), offset)
        if line:
            return f"line {line}"
    return f"an instruction at +0x{offsets[0]:x} (no line known)"


@functools.lru_cache(maxsize=4096)
def kernel_line(library: str, offset: int) -> int | None:
    """The kernel.cu line of the instruction at `offset` in `library` (innermost first)."""
    tool = shutil.which("addr2line")
    if tool is None:
        return None
    done = subprocess.run(
        [tool, "-e", library, "-i", f"0x{offset:x}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    found = _KERNEL_LINE.search(done.stdout)
    return int(found[1]) if found else None
