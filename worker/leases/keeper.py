"""LeaseKeeper: a node's leases as its lease service keeps them, and taking them back.

Leases are taken back, whatever their TTL, for the fair share (others wait) and from an
interactive block whose slot ran no call for `gpu_idle_s`, at every heartbeat (`reclaim`)
and at the holder's renewals (lease_service.py). Why is remembered (revoked.py) so that the
holder's next renewal says so. A release changes the ledger and tells the node which jobs'
leases changed (`on_change`); a tenant with a quota gets its reservation settled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import attrs

from vramfabric.broker.codec import encode
from vramfabric.broker.errors import LeaseDenied
from vramfabric.broker.messages import Event, Lease, ReleaseReply, RenewReply
from vramfabric.broker.subjects import Subjects

from ..node.metrics import WorkerMetrics
from .fairness import FleetShare
from .lease_intake import QUEUE_LIMIT, LeaseIntake, Publish
from .ledger import SliceLedger
from .quota import QuotaBook
from .revoked import Revoked

log = logging.getLogger(__name__)

# Called after the ledger changed for (tenant, job), e.g. to start or resize a puller.
OnChange = Callable[[str, str], None]


@attrs.define
class LeaseKeeper:
    """A node's leases as its lease service holds them: released, taken back, settled."""

    subjects: Subjects
    node: str
    ledger: SliceLedger
    metrics: WorkerMetrics
    on_change: OnChange
    publish: Publish
    fair: FleetShare
    # Called when a tenant starts waiting here: the fleet should hear it soon (an advert).
    on_waiting: Callable[[], None] = lambda: None
    # Strict quotas; None only where no tenant has one (a tenant with one is then denied).
    quota: QuotaBook | None = None
    queue_limit: int = QUEUE_LIMIT
    # An interactive lease whose slot ran nothing for this long is taken back (0: never).
    gpu_idle_s: float = 0.0
    _intake: LeaseIntake = attrs.field(init=False)
    _revoked: Revoked = attrs.field(factory=Revoked, init=False)
    _settling: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)

    async def reclaim(self) -> None:
        """Take back, whatever their TTL, idle blocks' leases and those others wait for.

        Called every heartbeat.
        """
        now = time.monotonic()
        self._take_back_idle(now)
        if not self.fair.waiting(now):
            return
        by_tenant: dict[str, list[Lease]] = {}
        for lease in self.ledger.holding():
            if self.ledger.is_live(lease.lease_id, now) and self.ledger.get(lease.lease_id):
                by_tenant.setdefault(lease.tenant, []).append(lease)
        for tenant, leases in by_tenant.items():
            ids, why = self.fair.to_revoke(tenant, leases, now)
            if ids:
                self._take_back(tenant, ids, why)
                event = Event(
                    "revoked", node=self.node, tenant=tenant, count=len(ids), at=time.time()
                )
                await self._intake.send(self.subjects.event(event.kind), encode(event))

    def _take_back_idle(self, now: float) -> None:
        """End the `fabric.gpu()` leases whose slot ran no call for `gpu_idle_s`.

        An open block in a notebook nobody uses would hold its slice for ever; its next call
        leases again (coordinator/calls/interactive.py).
        """
        if self.gpu_idle_s <= 0:
            return
        idle: dict[str, list[str]] = {}
        for lease in self.ledger.holding():
            if (
                self.subjects.is_interactive(lease.job)
                and self.ledger.is_live(lease.lease_id, now)
                and self.ledger.idle_for(lease.lease_id, now) >= self.gpu_idle_s
            ):
                idle.setdefault(lease.tenant, []).append(lease.lease_id)
        for tenant, ids in idle.items():
            self._take_back(tenant, ids, f"idle: no call for {self.gpu_idle_s:g} s")

    def _take_back(self, tenant: str, lease_ids: list[str], why: str) -> None:
        """End leases for the fair share, remembering why for their holder's next renewal."""
        log.info("leases taken back tenant=%s count=%d why=%s", tenant, len(lease_ids), why)
        self.metrics.leases_revoked_total.labels(tenant=tenant).inc(len(lease_ids))
        self._revoked.add(tenant, lease_ids, why)
        self._release(lease_ids, tenant)
        if self._strict(tenant) and self.quota is not None:
            task = asyncio.get_running_loop().create_task(self._settle(tenant))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)

    async def _settle(self, tenant: str) -> None:
        async with self._book.lock(tenant):
            await self._book.settle(tenant, time.time())

    def _with_revoked(self, reply: RenewReply, tenant: str) -> RenewReply:
        """The reply with the leases taken back from this tenant moved from unknown to revoked."""
        why = {i: r for i in reply.unknown if (r := self._revoked.pop(i, tenant)) is not None}
        if not why:
            return reply
        unknown = tuple(i for i in reply.unknown if i not in why)
        reason = "; ".join(sorted(set(why.values())))
        return attrs.evolve(reply, unknown=unknown, revoked=tuple(why), reason=reason)

    def _strict(self, tenant: str) -> bool:
        return self.fair.policy.quota_bytes(tenant) is not None

    @property
    def _book(self) -> QuotaBook:
        if self.quota is None:
            raise LeaseDenied(self.node, "quota bucket not open on this node")
        return self.quota

    def _waits(self, tenant: str, now: float) -> None:
        if self.fair.note_waiting(tenant, now):
            self.on_waiting()

    def _release(self, lease_ids: tuple[str, ...] | list[str], tenant: str) -> ReleaseReply:
        jobs = {(lease.tenant, lease.job) for i in lease_ids if (lease := self.ledger.get(i))}
        reply = self.ledger.release(lease_ids, tenant)
        for lease_tenant, job in jobs:
            self.on_change(lease_tenant, job)
        return reply
