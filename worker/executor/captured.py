"""What chunks print: an executor's stdout and stderr, kept so that a failed chunk can say.

The agent starts each executor with its stderr on a file of the agent's (an unlinked
temporary file, worker/executors/start.py), and the executor points its stdout there too
(process.py), so Python's `print`, C's stdio and a CUDA kernel's `printf` on the host path
all land in it. A chunk's text is what the file gained while the chunk ran; a failed chunk's
result keeps the last TAIL_BYTES of it (stdout and stderr together, in the order written),
and its traceback. The file is emptied when a chunk starts in a process where none runs, so
a function's lane (one chunk at a time) holds only its running chunk's text; in a kernels'
process several leases' chunks run at once, and a chunk's tail then holds what the others
printed meanwhile too. The agent reads the file's end itself when the process dies under a
chunk or a chunk passes its deadline (`read_tail`). The file never grows past MAX_FILE_BYTES:
it is emptied then, even while chunks run (their tails start over).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import stat
import sys
import threading
import time
from typing import Any

# How much of what a failed chunk printed its result keeps: the end, where the cause is.
TAIL_BYTES = 64 * 2**10
# How much of a failed chunk's traceback its result keeps (the end: the innermost frames).
TRACEBACK_CHARS = 16 * 2**10
# The capture file is emptied past this size, checked every TRIM_EVERY_S.
MAX_FILE_BYTES = 16 * 2**20
TRIM_EVERY_S = 0.5

_PRINTED, _TRACEBACK = "_vf_printed", "_vf_traceback"


def attach(exc: BaseException, printed: str, traceback: str = "") -> BaseException:
    """Have `exc` carry what its chunk printed and its traceback, to the chunk's result."""
    setattr(exc, _PRINTED, printed[-TAIL_BYTES:])
    setattr(exc, _TRACEBACK, traceback[-TRACEBACK_CHARS:])
    return exc


def carried(exc: BaseException) -> tuple[str, str]:
    """(what the chunk printed, its traceback) that `exc` carries; empty where none."""
    return str(getattr(exc, _PRINTED, "")), str(getattr(exc, _TRACEBACK, ""))


def read_tail(fd: int, start: int = 0, max_bytes: int = TAIL_BYTES) -> str:
    """The last `max_bytes` of the file `fd` from byte `start` on, as text."""
    size = os.fstat(fd).st_size
    begin = max(start if start <= size else 0, size - max_bytes)
    return os.pread(fd, size - begin, begin).decode("utf-8", errors="replace")


class Captured:
    """The executor's side: where each chunk's text starts in the file, and its tail."""

    def __init__(self, fd: int | None) -> None:
        """Capture through `fd` (the executor's stderr) if it is a file, else nothing."""
        self._fd = fd if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode) else None
        self._lock = threading.Lock()
        self._running = 0
        self._fflush: Any = None
        if self._fd is not None:
            # Every write goes to the end, also after the file is emptied under a writer.
            flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
            fcntl.fcntl(self._fd, fcntl.F_SETFL, flags | os.O_APPEND)
            with contextlib.suppress(OSError, AttributeError):
                self._fflush = ctypes.CDLL(None).fflush
                self._fflush.argtypes = [ctypes.c_void_p]
            threading.Thread(target=self._trim, name="trim-captured", daemon=True).start()

    def start(self) -> int:
        """A chunk starts: where its text begins (the file emptied if no chunk runs)."""
        if self._fd is None:
            return 0
        self._flush()  # what came before is not this chunk's
        with self._lock:
            end = os.lseek(self._fd, 0, os.SEEK_END)
            if end and not self._running:
                os.ftruncate(self._fd, 0)
                end = 0
            self._running += 1
        return end

    def end(self) -> None:
        """A chunk ended (its tail, if wanted, was read)."""
        if self._fd is not None:
            with self._lock:
                self._running -= 1

    def mark(self) -> int:
        """Where text printed from now on begins (the next chunk of a pack)."""
        if self._fd is None:
            return 0
        self._flush()
        return os.lseek(self._fd, 0, os.SEEK_END)

    def tail(self, start: int, max_bytes: int = TAIL_BYTES) -> str:
        """The last `max_bytes` printed since `start` (the buffers written out first)."""
        if self._fd is None:
            return ""
        self._flush()
        return read_tail(self._fd, start, max_bytes)

    def _flush(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        if self._fflush is not None:
            self._fflush(None)  # C's stdio buffers (a host-path kernel's own prints)

    def _trim(self) -> None:
        """Empty the file whenever it passes MAX_FILE_BYTES (a chunk printing without end)."""
        assert self._fd is not None
        while True:
            time.sleep(TRIM_EVERY_S)  # a size check, not synchronisation
            with contextlib.suppress(OSError):
                if os.lseek(self._fd, 0, os.SEEK_END) > MAX_FILE_BYTES:
                    os.ftruncate(self._fd, 0)
