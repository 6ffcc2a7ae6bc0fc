"""What an interactive call prints, sent to its caller while the call runs.

This runs in the executor process, inside `remote.apply`, never in a node agent. The
process's `sys.stdout` and `sys.stderr` become switches (once per process): what a call's
thread writes (or any thread, while a single call runs in the process: threads the call
started) goes to that call's `Printed`; anything else goes where it went before. A `Printed`
sends its text through `send`, the call's checkpoint channel to the node agent, which
forwards it to the caller (worker/chunks/calls.py): every FLUSH_S, at once when CHUNK_CHARS are
waiting, and when the call ends. A writer waits while a full buffer is sent, so a flood of
prints slows the call down instead of filling its memory.

A frame is one byte naming the stream (`o` stdout, `e` stderr) and the text in UTF-8.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

# How often waiting text is sent, and how much waits before a write sends it at once.
FLUSH_S = 0.1
CHUNK_CHARS = 32 * 1024
TAGS = {"stdout": b"o", "stderr": b"e"}

# The Printed of each thread running a call in this process (thread ident -> Printed).
_calls: dict[int, Printed] = {}
_lock = threading.Lock()
_flusher: threading.Thread | None = None


class Printed:
    """The text one call printed and has not sent yet."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        """Send frames with `send` (a blocking round trip, one at a time)."""
        self._send = send
        self._parts: list[tuple[str, str]] = []
        self._chars = 0
        self._lock = threading.Lock()  # guards _parts
        self._sending = threading.Lock()  # frames leave one at a time, in order
        # Why text stopped being sent (the node did not take a frame); None while it goes.
        self.lost: str | None = None

    def write(self, stream: str, text: str) -> None:
        """Keep `text` for the caller; send it now if enough is waiting."""
        with self._lock:
            if self._parts and self._parts[-1][0] == stream:
                self._parts[-1] = (stream, self._parts[-1][1] + text)
            else:
                self._parts.append((stream, text))
            self._chars += len(text)
            full = self._chars >= CHUNK_CHARS
        if full:
            self.flush()

    def flush(self) -> None:
        """Send everything waiting, in order."""
        with self._sending:
            with self._lock:
                parts, self._parts, self._chars = self._parts, [], 0
            for stream, text in parts:
                for at in range(0, len(text), CHUNK_CHARS):
                    piece = text[at : at + CHUNK_CHARS].encode("utf-8", "replace")
                    self._send_frame(TAGS[stream] + piece)

    def _send_frame(self, frame: bytes) -> None:
        if self.lost is not None:
            _to_own_stderr(frame)
            return
        try:
            self._send(frame)
        except Exception as exc:  # recorded in `lost`: the call itself goes on
            self.lost = f"{type(exc).__name__}: {exc}"
            _to_own_stderr(frame)


def _to_own_stderr(frame: bytes) -> None:
    """Text that cannot reach the caller: to the executor's own stderr (the node's log)."""
    if sys.__stderr__ is not None:
        sys.__stderr__.write(frame[1:].decode("utf-8", "replace"))


class _Switch:
    """`sys.stdout` or `sys.stderr` of an executor: a call's text to its Printed."""

    def __init__(self, stream: str, fallback: TextIO) -> None:
        self._stream = stream
        self._fallback = fallback

    def write(self, text: str) -> int:
        printed = _printed_of_this_thread()
        if printed is None:
            return self._fallback.write(text)
        printed.write(self._stream, str(text))
        return len(text)

    def flush(self) -> None:
        if _printed_of_this_thread() is None:
            self._fallback.flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        # encoding, errors, fileno, buffer...: those of the stream it replaced.
        return getattr(self._fallback, name)


def _printed_of_this_thread() -> Printed | None:
    printed = _calls.get(threading.get_ident())
    if printed is None and len(_calls) == 1:
        # A thread the call started (or a library's): while one call runs here, its own.
        printed = next(iter(_calls.values()), None)
    return printed


def _install() -> None:
    """Put the switches in place of sys.stdout and sys.stderr (once per process)."""
    global _flusher
    with _lock:
        if not isinstance(sys.stdout, _Switch):
            sys.stdout = _Switch("stdout", sys.stdout)
        if not isinstance(sys.stderr, _Switch):
            sys.stderr = _Switch("stderr", sys.stderr)
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_forever, name="vf-printed", daemon=True)
            _flusher.start()


def _flush_forever() -> None:
    while True:
        time.sleep(FLUSH_S)  # the pace of a running call's output, not synchronisation
        with _lock:
            running = list(_calls.values())
        for printed in running:
            printed.flush()


@contextlib.contextmanager
def sent_while_running(send: Callable[[bytes], None]) -> Iterator[Printed]:
    """Inside: what this thread (and the threads it starts) prints goes out through `send`."""
    _install()
    printed = Printed(send)
    me = threading.get_ident()
    with _lock:
        _calls[me] = printed
    try:
        yield printed
    finally:
        with _lock:
            del _calls[me]
        printed.flush()
