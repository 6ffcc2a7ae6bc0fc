"""Heartbeat: read GPU health, reap expired leases, take back leases, publish the advert."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
from nats.js.kv import KeyValue

from vramfabric.broker.codec import encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import VramfabricError, nats_errors
from vramfabric.broker.messages import Event, Lease, NodeAdvert
from vramfabric.broker.subjects import MAX_PACK_CHUNKS, Subjects
from vramfabric.kernels.code import python_version
from vramfabric.kernels.registry import kernel_names

from .leases.ledger import SliceLedger
from .node.health import NvmlProbe
from .node.metrics import WorkerMetrics
from .node.settings import WorkerSettings

log = logging.getLogger(__name__)

# An advert asked for early (after a grant or release) waits at least this long after the last.
_MIN_ADVERT_GAP_S = 0.05


def node_facts(settings: WorkerSettings, containment: str) -> dict[str, Any]:
    """What a node's adverts say besides its ledger: what work it runs, and how.

    `kernels` names its registered kernels (a few dozen bytes, never their sources), so
    coordinators lease for a kernel only where it is. Its kernel modules are imported to
    read their names (`vramfabric worker` imported them already, to fail a bad one at start).

    Raises:
        ValueError, ImportError: a kernel module does not load.
    """
    return {
        "python": python_version(),
        "allow_code": settings.allow_code,
        "containment": containment,
        "packs": True,
        "max_pack_chunks": MAX_PACK_CHUNKS,
        "kernels": kernel_names(settings.kernel_modules),
    }


@attrs.define
class Heartbeat:
    """Publishes adverts every `heartbeat_s`, and soon after `poke()` when leases change."""

    conn: Connection
    subjects: Subjects
    kv: KeyValue
    ledger: SliceLedger
    metrics: WorkerMetrics
    heartbeat_s: float
    # Called on every beat with the leases that expired since the last one (maybe none).
    on_beat: Callable[[list[Lease]], None]
    # Node facts beside the ledger's (`node_facts`), carried in every advert.
    facts: Mapping[str, Any] = attrs.field(factory=dict)
    # Facts that change, read at each beat (the tenants this node saw waiting).
    live_facts: Callable[[], Mapping[str, Any]] = attrs.field(default=dict)
    # Called on every beat before the advert: the fair share takes back leases others wait for.
    reclaim: Callable[[], Awaitable[None]] | None = None
    # NVML's view of the real GPUs (None when simulated): read at most once per heartbeat_s.
    probe: NvmlProbe | None = attrs.field(
        default=attrs.Factory(lambda self: NvmlProbe.open(self.ledger.gpus), takes_self=True)
    )
    _probed_at: float = attrs.field(default=float("-inf"), init=False)
    _poked: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _running: bool = attrs.field(default=True, init=False)

    def poke(self) -> None:
        """Ask for an advert soon (the fleet view should see grants and releases quickly)."""
        self._poked.set()

    def stop(self) -> None:
        """End the loop after the current beat.

        Cancelling alone is not enough: nats-py's JetStream publish turns a cancellation
        into a timeout, which the loop would log and survive.
        """
        self._running = False
        self._poked.set()

    async def run(self) -> None:
        """Beat until stopped; a failed publish is logged and retried on the next beat."""
        try:
            await self._beat_until_stopped()
        finally:
            if self.probe is not None:
                self.probe.close()

    async def _beat_until_stopped(self) -> None:
        while self._running:
            try:
                await self.beat()
            except VramfabricError as exc:
                log.warning("advert failed node=%s error=%s", self.ledger.node, exc)
            try:
                await asyncio.wait_for(self._poked.wait(), self.heartbeat_s)
                await asyncio.sleep(_MIN_ADVERT_GAP_S)  # coalesce a burst of grants into one advert
            except TimeoutError:
                pass
            self._poked.clear()

    async def beat(self) -> None:
        """Read GPU health, reap, then publish one advert."""
        drained = await self._check_health()
        expired = self.ledger.reap(time.monotonic())
        self.on_beat(drained + expired)
        if self.reclaim is not None:
            await self.reclaim()
        if expired:
            log.info("leases expired node=%s count=%d", self.ledger.node, len(expired))
            await self._event("expired", expired[0].tenant, len(expired))
        self.metrics.set_holding(self.ledger.holding())
        advert = attrs.evolve(self.ledger.advert(time.time()), **self.facts, **self.live_facts())
        data = encode(advert)
        with nats_errors():
            await self.conn.nc.publish(self.subjects.node_advert(self.ledger.node), data)
            await self.kv.put(self.ledger.node, data)

    async def _check_health(self) -> list[Lease]:
        """Give the ledger NVML's readings; return the leases of GPUs that turned unhealthy."""
        now = time.monotonic()
        if self.probe is None or now - self._probed_at < self.heartbeat_s:
            return []
        self._probed_at = now
        # In a thread: NVML calls block, and a failing GPU can make them slow.
        readings = await asyncio.to_thread(self.probe.read)
        before = {r.index: self.ledger.problem(r.index) for r in readings}
        drained = self.ledger.observe(readings)
        for r in readings:
            if r.problem and not before[r.index]:
                log.warning(
                    "gpu unhealthy node=%s gpu=%d problem=%s leases_drained=%d",
                    self.ledger.node,
                    r.index,
                    r.problem,
                    sum(1 for lease in drained if lease.gpu == r.index),
                )
            elif before[r.index] and not r.problem:
                log.info("gpu healthy again node=%s gpu=%d", self.ledger.node, r.index)
        return drained

    async def goodbye(self) -> None:
        """Leave the fleet now: an advert with no GPUs for followers, and no KV entry."""
        node = self.ledger.node
        farewell = NodeAdvert(node=node, gpus=(), tenants={}, sent_at=time.time())
        with nats_errors():
            await self.conn.nc.publish(self.subjects.node_advert(node), encode(farewell))
            await self.kv.delete(node)

    async def _event(self, kind: str, tenant: str, count: int) -> None:
        # nats-py's errors mapped: an unmapped one (a full buffer while disconnected) would
        # end the heartbeat loop, and with it this node's reaping and adverts.
        event = Event(kind=kind, node=self.ledger.node, tenant=tenant, count=count, at=time.time())
        with nats_errors():
            await self.conn.nc.publish(self.subjects.event(kind), encode(event))
