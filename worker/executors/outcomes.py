"""What a chunk running in an executor learns: its output, or why it failed.

A `done` frame brings the output, or the error the work raised (`failure`). A chunk still
running when its process ended is judged by who is to blame (`judged`): a bystander (the
pool killed the process for another chunk's deadline, or another chunk said it poisoned
it) runs again and pays nothing; the only chunk there, or one of a node that is stopping,
fails as crashed; one of several in a process that died on its own is a suspect, to be run
again alone (chunks/runner.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import attrs

from vramfabric.broker.errors import ChunkFailed, ErrorKind, ExecutorCrashed, VramfabricError

from ..executor.ipc import Done
from .layout import ExecKey

# How the pool kills a process for one chunk's sake (past its deadline, or its lease ended
# under it): its other chunks are innocent.
FOR_A_NEIGHBOUR = (
    "executor killed: a chunk beside this one had to stop (past its deadline, or its lease ended)"
)
SaveCheckpoint = Callable[[bytes], Awaitable[None]]


class Bystander(ExecutorCrashed):
    """The chunk's executor ended for another chunk's sake: run it again, it pays nothing.

    Never leaves the worker (ChunkRunner re-runs the chunk), so it has no wire kind of its own.
    """


class Suspect(ExecutorCrashed):
    """The chunk's executor crashed while other chunks ran there too: any of them may be why."""


@attrs.define
class Running:
    """A chunk running in an executor: its output to come, and where its checkpoints go."""

    future: asyncio.Future[bytes]
    save: SaveCheckpoint | None
    # Monotonic time past which the chunk is killed, and its deadline in seconds.
    deadline: float = float("inf")
    timeout_s: float = 0.0
    # The seconds the work ran in its executor thread (no wait for the process to start or
    # for the frame to be read): packing reads it.
    cost_s: float = 0.0
    # The process its lease's chunks belong in (worker/executors/layout.py); it may run in another
    # lane of its tenant while that one is still starting (ExecutorPool).
    home: ExecKey | None = None


def failure(frame: Done) -> VramfabricError:
    """The error a `done` frame reports."""
    message = str(frame.error)
    try:
        kind = ErrorKind(frame.kind)
    except ValueError:
        kind = ErrorKind.ERROR
    if kind is ErrorKind.CRASHED:
        return ExecutorCrashed(message)
    return ChunkFailed(kind, message)


def judged(why: str, running: int, culprit_known: bool, doom: str) -> ExecutorCrashed:
    """What a chunk still running when the process ended learns, by who is to blame."""
    if culprit_known or doom == FOR_A_NEIGHBOUR:
        return Bystander(why)
    if doom.startswith(("idle", "executor killed: the node")) or running == 1:
        return ExecutorCrashed(why)
    # Died on its own (or sent garbage) with several chunks in it: each is a suspect.
    return Suspect(why)
