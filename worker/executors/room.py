"""ExecutorRoom: the caps on a node's executor processes, per GPU and per node.

Every process counts from the moment its start is reserved until it has exited (a killed
process still holds memory until it is gone). A start that would pass a cap waits, stopping
the longest idle process that is in the way; nothing is ever started past a cap, so narrowing
crash suspects or a burst of leases cannot make a node sprawl.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

import attrs

from .handle import ExecutorProcess
from .layout import ExecKey

# A start waiting for room looks again this often even if nothing told it to.
ROOM_POLL_S = 0.25


@attrs.define
class ExecutorRoom:
    """Counts executor processes and makes room for a new one under the caps."""

    per_gpu: int
    per_node: int
    _running: set[ExecutorProcess] = attrs.field(factory=set, init=False)
    _reserved: collections.Counter[int] = attrs.field(factory=collections.Counter, init=False)
    # Set whenever a process ends or a chunk leaves one: a start waiting for room looks again.
    _changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    # The most processes this node has had at once.
    peak: int = attrs.field(default=0, init=False)

    def count(self, gpu: int | None = None) -> int:
        """Processes that exist or are being started, on `gpu` or on the whole node."""
        if gpu is None:
            return len(self._running) + sum(self._reserved.values())
        return sum(1 for exe in self._running if exe.key[0] == gpu) + self._reserved[gpu]

    def full(self, gpu: int) -> bool:
        """Whether one more process on `gpu` would pass a cap."""
        return self.count(gpu) >= self.per_gpu or self.count() >= self.per_node

    async def reserve(self, gpu: int, in_use: Callable[[ExecKey], bool]) -> None:
        """Wait until a process on `gpu` fits, stopping idle ones (not `in_use`) to make room."""
        while self.full(gpu):
            gpu_full = self.count(gpu) >= self.per_gpu
            idle = [
                exe
                for exe in self._running
                if exe.alive
                and exe.ready.done()
                and not exe.tasks
                and not in_use(exe.key)
                and (exe.key[0] == gpu or not gpu_full)
            ]
            if idle:
                min(idle, key=lambda exe: exe.idle_since).kill("idle: room for another executor")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), ROOM_POLL_S)
        self._reserved[gpu] += 1

    def started(self, gpu: int, exe: ExecutorProcess | None) -> None:
        """A reserved start ended: with its process, or with None if it failed."""
        self._reserved[gpu] -= 1
        if exe is not None:
            self._running.add(exe)
            self.peak = max(self.peak, self.count())
        self._changed.set()

    def ended(self, exe: ExecutorProcess) -> None:
        """A process has exited."""
        self._running.discard(exe)
        self._changed.set()

    def changed(self) -> None:
        """A chunk left a process: it may be idle now."""
        self._changed.set()
