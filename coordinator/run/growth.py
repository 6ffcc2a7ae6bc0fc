"""LeaseGrowth: a run's lease set grows while it runs, up to the messages it has left.

A run leases `FIRST_LEASES` slices before its first chunk goes out and asks for the rest of
its target right after, while the first chunks run; later it asks again whenever the fleet
changes (a node joins, leases come free). It never holds more leases than it has messages
left (packing.py, `Packer.messages`): with auto packing its first leases wait for a first
result, which says whether the chunks travel in packs, before the rest are asked for.
"""

from __future__ import annotations

import asyncio
import logging

import attrs

from vramfabric.broker.stopping import stop_task

from ..leases.fleet import FleetView
from ..leases.leasing import LeasePool
from .packing import PROBE_LEASES_WAIT_S, Packer
from .results import ResultsConsumer

log = logging.getLogger(__name__)

# Leases asked for before the first chunk goes out; the rest of the target are asked for
# right after, while the first chunks run. Leasing 1,000 slices before sending a chunk held
# back a job of 1,000 tiny chunks by their whole acquisition (18-55 ms on 2 cores).
FIRST_LEASES = 32


@attrs.define
class LeaseGrowth:
    """Adds leases to a run's pool as the fleet frees capacity, up to the messages left."""

    pool: LeasePool
    fleet: FleetView
    results: ResultsConsumer
    packer: Packer
    # How long to wait for news of the fleet before looking again anyway.
    node_ttl_s: float
    job_id: str
    _task: asyncio.Task[None] | None = attrs.field(default=None, init=False)

    def start(self, target: int, rest_now: bool) -> None:
        """Grow towards `target` leases in the background (`rest_now`: ask at once)."""
        self._task = asyncio.get_running_loop().create_task(self._grow(target, rest_now))

    async def stop(self) -> BaseException | None:
        """Stop growing (the pool must be closing); what the growth died of, if it did."""
        died = None
        if self._task is not None:
            died = await stop_task(self._task)  # a lease request may swallow one cancel
        # A lease request it left in flight is the pool's: its release waits for it.
        return died if isinstance(died, Exception) else None

    async def _grow(self, target: int, rest_now: bool) -> None:
        """Ask for leases until the pool closes: at once (`rest_now`), then on fleet changes."""
        pool = self.pool
        while not pool.closing:
            if rest_now and self.packer.probing:
                # Tiny chunks would leave most of the rest idle (see Packer.messages).
                await self.results.speed.first(PROBE_LEASES_WAIT_S)
            elif not rest_now:
                await self.fleet.wait_changed(timeout_s=self.node_ttl_s)
            if pool.closing:
                return
            pool.prune(set(self.fleet.adverts))
            total = self.results.total
            left = target if total is None else self.packer.messages(total - self.results.n_done)
            want = min(target, left) - len(pool)
            if want > 0:
                # Also when the fleet looks full: the pool then asks one node, which tells
                # the fleet this tenant waits for its fair share.
                added = await pool.acquire(want)
                if added and not rest_now:  # the rest after the first request is no news
                    log.info(
                        "leases added mid-run job=%s added=%d held=%d",
                        self.job_id,
                        added,
                        len(pool),
                    )
            rest_now = False
