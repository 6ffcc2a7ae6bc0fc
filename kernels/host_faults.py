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

from .kernel import KernelArgumentError

_PC = re.compile(r"@pc:([0-9a-f]+)@")
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
    text = _PC.sub(lambda m: _where(library, int(m[1], 16)), report)
    joiner = " " if text.startswith(("wrote ", "read ")) else ": "
    return f"kernel {kernel}{joiner}{text}"


def _where(library: Path, offset: int) -> str:
    line = kernel_line(str(library), offset)
    return f"line {line}" if line else f"an instruction at +0x{offset:x} (no line known)"


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
