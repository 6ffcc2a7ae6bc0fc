"""FleetView: the latest advert of every live node.

It starts from the adverts bucket and then follows the nodes' heartbeat subject. A core
subscription survives a lost or restarted server (the client subscribes again), where a KV
watcher's ephemeral consumer does not. A node silent for the node TTL is dropped, as the
bucket's TTL would drop it. The view is advisory: a node's ledger is the truth, and a stale
advert only costs a denial.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

import attrs
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from vramfabric.broker import buckets
from vramfabric.broker.codec import decode, encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, VramfabricError, from_nats, nats_errors
from vramfabric.broker.messages import HeldReply, HeldRequest, NodeAdvert
from vramfabric.broker.settings import BrokerSettings

from ..metrics import CoordinatorMetrics

log = logging.getLogger(__name__)


@attrs.define
class FleetView:
    """Node adverts by node name; `changed` is set whenever one arrives or vanishes."""

    conn: Connection
    broker: BrokerSettings
    metrics: CoordinatorMetrics = attrs.field(factory=CoordinatorMetrics)
    adverts: dict[str, NodeAdvert] = attrs.field(factory=dict, init=False)
    changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    invalid: int = attrs.field(default=0, init=False)
    _heard_at: dict[str, float] = attrs.field(factory=dict, init=False)
    _sub: Subscription | None = attrs.field(default=None, init=False)
    _pruner: asyncio.Task[None] | None = attrs.field(default=None, init=False)

    async def start(self) -> None:
        """Subscribe to heartbeats, then load the adverts the bucket holds now.

        Safe to call again after it failed part-way (the subscription is made once).
        """
        if self._sub is None:
            subject = self.broker.subjects.advert_filter()
            self._sub = await self.conn.nc.subscribe(subject, cb=self._on_advert)
        await self._load()
        if self._pruner is None:
            self._pruner = asyncio.get_running_loop().create_task(self._prune_loop())

    async def _load(self) -> None:
        for key, data in (await stored_adverts(self.conn, self.broker)).items():
            if key not in self.adverts:
                self._apply(data, key)

    async def _on_advert(self, msg: Msg) -> None:
        self._apply(msg.data, msg.subject)

    def _apply(self, data: bytes, where: str) -> None:
        try:
            advert = decode(NodeAdvert, data)
        except InvalidMessage as exc:
            self.invalid += 1
            self.metrics.invalid("advert")
            log.warning("bad advert ignored from=%s error=%s", where, exc)
            return
        if advert.gpus:
            self.adverts[advert.node] = advert
            self._heard_at[advert.node] = time.monotonic()
        else:  # a stopping node says goodbye with an advert of no GPUs
            self._forget(advert.node)
        self.changed.set()

    def _forget(self, node: str) -> None:
        self.adverts.pop(node, None)
        self._heard_at.pop(node, None)

    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(self.broker.node_ttl_s / 4)  # the pruning period itself
            cutoff = time.monotonic() - self.broker.node_ttl_s
            silent = [node for node, t in self._heard_at.items() if t < cutoff]
            for node in silent:
                log.info("node silent, dropped from the fleet view node=%s", node)
                self._forget(node)
            if silent:
                self.changed.set()

    async def wait_changed(self, timeout_s: float) -> bool:
        """Wait until an advert changes; True if one did within `timeout_s`."""
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def free_slices(self, slice_bytes: int) -> int:
        """Leases of `slice_bytes` the fleet advertises as free now."""
        return sum(a.free_slices(slice_bytes) for a in self.adverts.values())

    async def stop(self) -> None:
        """Stop following adverts."""
        if self._pruner is not None:
            self._pruner.cancel()
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception as exc:  # logged: a closed or lost connection has nothing to undo
                log.debug("advert unsubscribe failed error=%s", from_nats(exc))


async def stored_adverts(conn: Connection, broker: BrokerSettings) -> dict[str, bytes]:
    """The adverts in the bucket now, undecoded, by node (a node gone meanwhile is skipped)."""
    js = conn.fleet_js  # a tenant's account reads it through an import (auth on)
    if broker.in_tenant_account:
        with nats_errors():
            kv = await js.key_value(broker.subjects.nodes_bucket())
    else:
        kv = await buckets.nodes_bucket(js, broker)
    out: dict[str, bytes] = {}
    for key in await buckets.kv_keys(js, broker, broker.subjects.nodes_bucket()):
        with nats_errors():
            try:
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:  # expired since the listing
                continue
        if entry.value:
            out[key] = entry.value
    return out


# Nodes asked at once for a tenant's leases (`held_by_job`).
_HELD_IN_FLIGHT = 32


async def held_by_job(
    conn: Connection, broker: BrokerSettings, tenants: Iterable[str], nodes: Iterable[str]
) -> dict[str, int]:
    """Leases per `<tenant>.<job>` on `nodes`, as each node tells each of `tenants` its own.

    Adverts carry no job ids (every tenant reads them): a tenant asks the nodes for its own
    leases with the lease op `held`, which only it (and the operator) may send. A node that
    does not answer is left out (logged).
    """
    gate = asyncio.Semaphore(_HELD_IN_FLIGHT)

    async def ask(tenant: str, node: str) -> dict[str, int]:
        subject = broker.subjects.lease(tenant, node, "held")
        async with gate:
            try:
                with nats_errors():
                    msg = await conn.nc.request(
                        subject, encode(HeldRequest()), timeout=broker.request_timeout_s
                    )
                jobs = decode(HeldReply, msg.data).jobs
            except VramfabricError as exc:  # logged: that node's leases are left out
                log.warning("held leases not read node=%s tenant=%s error=%s", node, tenant, exc)
                return {}
        return {f"{tenant}.{job}": n for job, n in jobs.items()}

    node_list = list(nodes)
    pairs = [(tenant, node) for tenant in tenants for node in node_list]
    out: dict[str, int] = {}
    for held in await asyncio.gather(*(ask(tenant, node) for tenant, node in pairs)):
        for key, n in held.items():
            out[key] = out.get(key, 0) + n
    return out
