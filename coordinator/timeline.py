"""Timeline: a run's leases held and chunks done over time, for the lease plot.

Sampled on a timer, and on demand at the moments that shape the curve (leases acquired,
leases released), so the peak and the final zero are in the series however short the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import attrs

# (seconds since the run started, leases held, chunks done)
Point = tuple[float, int, int]


@attrs.define
class Timeline:
    """Samples `leases()` and `done()` every `interval_s` while running."""

    leases: Callable[[], int]
    done: Callable[[], int]
    interval_s: float = 0.05
    points: list[Point] = attrs.field(factory=list, init=False)
    _t0: float = attrs.field(factory=time.perf_counter, init=False)
    _task: asyncio.Task[None] | None = attrs.field(default=None, init=False)

    def sample(self) -> None:
        """Record one point now."""
        self.points.append((round(time.perf_counter() - self._t0, 4), self.leases(), self.done()))

    def start(self) -> None:
        """Sample now and then every `interval_s` until stopped."""
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)  # the sampling period itself
            self.sample()

    async def stop(self) -> tuple[Point, ...]:
        """Stop sampling, take a last sample, and return the series."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.sample()
        return tuple(self.points)
