"""Stopping a task that talks to NATS: cancel it, and cancel it again until it has ended.

nats-py swallows a cancellation that lands while a publish hands its bytes to the flusher
(`Client._flush_pending` catches `CancelledError`): the publish goes on and its task with it.
A periodic task cancelled there (a job's heartbeat, a lease renewer) then runs on for good,
and whoever awaits its end waits for ever: a job's run hung at its end this way, about one
run in twenty, on a busy 2-core machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

# A task still running this long after a cancel is cancelled again.
CANCEL_AGAIN_S = 0.5


async def stop_task(task: asyncio.Task[Any]) -> BaseException | None:
    """Cancel `task` until it has ended; what it raised (None: it returned or was cancelled)."""
    while not task.done():
        task.cancel()
        # Waits for the task, not for time: a task that ends at once returns at once.
        await asyncio.wait({task}, timeout=CANCEL_AGAIN_S)
    if task.cancelled():
        return None
    return task.exception()


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """`stop_task` each of `tasks` at once, until all have ended (what they raised is dropped)."""
    await asyncio.gather(*(stop_task(task) for task in list(tasks)))
