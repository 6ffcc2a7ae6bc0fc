"""What a hung test was waiting for: its asyncio tasks' await chains, just before its timeout.

pytest-timeout prints the threads' stacks, which for an asyncio test show only the event loop
idling in `select`. This report, written to the test's captured stderr shortly before the
timeout fires, names every pending task and the line each awaits on.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any, TextIO

# Await chains are cut at this depth (a recursion of awaits would never end).
_MAX_DEPTH = 40


def running_loops() -> list[asyncio.AbstractEventLoop]:
    """The event loops some thread of this process is running now."""
    loops: list[asyncio.AbstractEventLoop] = []
    for top in sys._current_frames().values():
        frame: FrameType | None = top
        while frame is not None:
            owner = frame.f_locals.get("self")
            if frame.f_code.co_name == "run_forever" and isinstance(
                owner, asyncio.AbstractEventLoop
            ):
                loops.append(owner)
                break
            frame = frame.f_back
    return loops


def await_chain(coro: Any) -> list[str]:
    """`file:line function` of each coroutine a task's coroutine awaits, outermost first."""
    lines: list[str] = []
    while coro is not None and len(lines) < _MAX_DEPTH:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        frame = frame or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        inner = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        coro = inner or getattr(coro, "ag_await", None)
    if coro is not None:  # a future, or the chain cut at its depth
        lines.append(f"awaiting {coro!r:.200}")
    return lines


def report() -> str:
    """Every pending task of every running loop, with its await chain."""
    out = [f"hang report at {time.strftime('%H:%M:%S')}: pending asyncio tasks"]
    for loop in running_loops():
        try:
            tasks = asyncio.all_tasks(loop)
        except RuntimeError as exc:  # the set changed under us, again and again: say so
            out.append(f"  tasks of {loop!r} unreadable: {exc}")
            continue
        for task in sorted(tasks, key=lambda t: t.get_name()):
            out.append(f"  task {task.get_name()}")
            out.extend(f"    {line}" for line in await_chain(task.get_coro()))
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def reported_after(delay_s: float, stream: TextIO) -> Iterator[None]:
    """Write `report()` to `stream` if the block still runs after `delay_s`."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(delay_s):
            stream.write(report())
            stream.flush()

    watcher = threading.Thread(target=watch, name="hang-report", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
