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
# Past this many points the series is halved, so a long run's series stays bounded (at 20 Hz
# a day would be 1.7 million points) while its resolution coarsens with its length.
MAX_POINTS = 10_000


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
        """Record one point now; halve the series when it outgrows MAX_POINTS."""
        self.points.append((round(time.perf_counter() - self._t0, 4), self.leases(), self.done()))
        if len(self.points) > MAX_POINTS:
            # Of each pair keep the point with more leases, so the peak stays in the series;
            # the newest point stays whole (an odd one out is kept as is).
            pairs = zip(self.points[0::2], self.points[1::2], strict=False)
            halved = [max(pair, key=lambda p: p[1]) for pair in pairs]
            self.points = halved + self.points[len(halved) * 2 :]

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
