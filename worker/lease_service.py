"""Lease request handlers: acquire, renew and release on `vf.lease.*.<node>.*`.

The tenant comes from the subject (the server's permissions guard it), never the payload.
Every request gets a reply: the answer, or an ErrorReply saying what was wrong with it.
A tenant with a quota is served under its QuotaBook lock: the reservation in KV comes first,
the ledger change after it, so no node grants past the reservation it wrote.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import attrs
from nats.aio.msg import Msg

from vramfabric.broker.codec import decode, encode
from vramfabric.broker.errors import InvalidMessage, LeaseDenied, VramfabricError
from vramfabric.broker.messages import (
    ErrorReply,
    Event,
    LeaseGrant,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewReply,
    RenewRequest,
    round_up,
)
from vramfabric.broker.subjects import Subjects

from .fairness import SHARE, FleetShare
from .ledger import SliceLedger
from .metrics import WorkerMetrics
from .quota import QUOTA, QuotaBook

log = logging.getLogger(__name__)

# Called after the ledger changed for (tenant, job), e.g. to start or resize a puller.
OnChange = Callable[[str, str], None]
# Core NATS publish, for events.
Publish = Callable[[str, bytes], Awaitable[None]]


@attrs.define
class LeaseService:
    """Serves one node's lease requests against its ledger."""

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

    async def handle(self, msg: Msg) -> None:
        """Answer one request; a bad one gets an ErrorReply and changes nothing."""
        op, tenant = "unknown", ""
        t0 = time.perf_counter()
        if msg.reply and not self.subjects.is_inbox(msg.reply):
            # Answering would publish, with this agent's rights, where the asker chose.
            self.metrics.invalid("lease.reply")
            log.warning("lease request refused: reply %r is not an inbox", msg.reply)
            return
        try:
            tenant, node, op = self.subjects.parse_lease(msg.subject)
            if node != self.node:
                raise InvalidMessage("lease subject", f"addressed to node {node!r}")
            policy = self.fair.policy
            if policy.tenants and tenant not in policy.tenants:
                raise InvalidMessage(
                    "lease subject", f"tenant {tenant!r} is not in the tenants file"
                )
            reply: LeaseGrant | RenewReply | ReleaseReply | ErrorReply = await self._serve(
                tenant, op, msg.data
            )
            outcome = "denied" if isinstance(reply, LeaseGrant) and reply.denied else "ok"
        except (InvalidMessage, ValueError) as exc:
            self.metrics.invalid(f"lease.{op}")
            log.warning("bad lease request subject=%s error=%s", msg.subject, exc)
            kind = InvalidMessage.kind
            reply, outcome = ErrorReply(kind=kind, error=str(exc)), "invalid"
        except VramfabricError as exc:  # the quota bucket could not be read or written
            log.warning("lease request failed subject=%s error=%s", msg.subject, exc)
            reply, outcome = ErrorReply(kind=exc.kind, error=str(exc)), "error"
        self.metrics.lease_requests_total.labels(tenant=tenant, op=op, outcome=outcome).inc()
        self.metrics.lease_request_seconds.labels(op=op).observe(time.perf_counter() - t0)
        if msg.reply:
            await msg.respond(encode(reply))
        event = _event_of(reply, self.node, tenant if outcome == "ok" else "")
        if event is not None:
            await self.publish(self.subjects.event(event.kind), encode(event))

    async def _serve(
        self, tenant: str, op: str, data: bytes
    ) -> LeaseGrant | RenewReply | ReleaseReply:
        # Expiry runs on the monotonic clock; the wall clock dates `expires_at` and quotas.
        now, wall = time.monotonic(), time.time()
        if op == "acquire":
            req = decode(LeaseRequest, data)
            if not self._strict(tenant):
                return self._acquire(tenant, req, now, wall, self._fair_cap(tenant, req, now))
            async with self._book.lock(tenant):
                return await self._acquire_strict(tenant, req)
        if op == "renew":
            return await self._renew(tenant, decode(RenewRequest, data), now, wall)
        ids = decode(ReleaseRequest, data).lease_ids
        if not self._strict(tenant):
            return self._release(ids, tenant)
        async with self._book.lock(tenant):
            reply = self._release(ids, tenant)
            if reply.released:
                await self._book.settle(tenant, wall)
        return reply

    def _strict(self, tenant: str) -> bool:
        return self.fair.policy.quota_bytes(tenant) is not None

    @property
    def _book(self) -> QuotaBook:
        if self.quota is None:
            raise LeaseDenied(self.node, "quota bucket not open on this node")
        return self.quota

    def _fair_cap(self, tenant: str, req: LeaseRequest, now: float) -> int:
        """How many of the request's slices the fair share allows (a retry: all, its answer)."""
        if self.ledger.knows(req.request_id):
            return req.count
        need = round_up(req.slice_bytes, self.ledger.granule_bytes)
        cap, reason = self.fair.grant_cap(tenant, need, req.count, now)
        if reason:
            self._waits(tenant, now)
        return cap

    async def _acquire_strict(self, tenant: str, req: LeaseRequest) -> LeaseGrant:
        """Reserve the quota in KV, then grant at most what was reserved."""
        # Read after the lock: other requests may have run meanwhile.
        now, wall = time.monotonic(), time.time()
        cap = self._fair_cap(tenant, req, now)
        if self.ledger.knows(req.request_id) or cap == 0:
            return self._acquire(tenant, req, now, wall, cap)
        need = round_up(req.slice_bytes, self.ledger.granule_bytes)
        # Never reserve more than fits here: the rest of the quota stays for other nodes.
        free = self.ledger.advert(wall).free_slices(need)
        if free == 0:
            return self._acquire(tenant, req, now, wall, cap)  # the ledger says why
        try:
            cap = await self._book.reserve(tenant, need, min(cap, free), req.ttl_s, wall)
        except LeaseDenied as exc:
            return self._deny(tenant, exc.reason)
        if cap == 0:
            return self._deny(tenant, QUOTA)
        grant = self._acquire(tenant, req, time.monotonic(), wall, cap)
        if len(grant.leases) < cap:
            await self._book.settle(tenant, wall)  # reserved more than the ledger gave
        return grant

    def _acquire(
        self, tenant: str, req: LeaseRequest, now: float, wall: float, cap: int
    ) -> LeaseGrant:
        if not self.ledger.knows(req.request_id):  # a retry gets its first answer again
            if cap == 0:
                return self._deny(tenant, SHARE)
            req = attrs.evolve(req, count=cap)
        grant = self.ledger.grant(req, tenant, now, wall)
        log.debug("lease request job=%s count=%d granted=%d", req.job, req.count, len(grant.leases))
        if len(grant.leases) < req.count:
            # Not all it asked for, for lack of room: it waits (the fleet learns by adverts).
            self._waits(tenant, now)
        if grant.leases:
            self.on_change(tenant, req.job)
        return grant

    def _deny(self, tenant: str, reason: str) -> LeaseGrant:
        self.metrics.lease_denials_total.labels(tenant=tenant, reason=reason).inc()
        return LeaseGrant(node=self.node, leases=(), denied=reason)

    async def _renew(self, tenant: str, renew: RenewRequest, now: float, wall: float) -> RenewReply:
        revoke = self.fair.to_revoke(tenant, renew.lease_ids, now)
        if revoke:
            log.info("leases revoked for fair share tenant=%s count=%d", tenant, len(revoke))
            self.metrics.leases_revoked_total.labels(tenant=tenant).inc(len(revoke))
            self._release(revoke, tenant)
        gone = set(revoke)
        keep = [i for i in renew.lease_ids if i not in gone]
        if not self._strict(tenant):
            reply = self.ledger.renew(keep, tenant, renew.ttl_s, now, wall)
            return attrs.evolve(reply, revoked=tuple(revoke))
        async with self._book.lock(tenant):
            # The reservation is extended first: a lease never outlives the hold on its quota.
            live = [
                lease
                for i in keep
                if (lease := self.ledger.get(i)) is not None
                and lease.tenant == tenant
                and self.ledger.is_live(i, now)
            ]
            over = await self._book.renew(tenant, live, renew.ttl_s, wall)
            if over:
                log.warning("leases past the quota revoked tenant=%s count=%d", tenant, len(over))
                self._release(over, tenant)
                revoke += over
            reply = self.ledger.renew(
                [i for i in keep if i not in over], tenant, renew.ttl_s, time.monotonic(), wall
            )
        return attrs.evolve(reply, revoked=tuple(revoke))

    def _waits(self, tenant: str, now: float) -> None:
        if self.fair.note_waiting(tenant, now):
            self.on_waiting()

    def _release(self, lease_ids: tuple[str, ...] | list[str], tenant: str) -> ReleaseReply:
        jobs = {(lease.tenant, lease.job) for i in lease_ids if (lease := self.ledger.get(i))}
        reply = self.ledger.release(lease_ids, tenant)
        for lease_tenant, job in jobs:
            self.on_change(lease_tenant, job)
        return reply


def _event_of(reply: object, node: str, tenant: str) -> Event | None:
    """The `granted`/`released` event for observers, if the reply changed the ledger."""
    now = time.time()
    if isinstance(reply, LeaseGrant) and reply.leases:
        job = reply.leases[0].job
        return Event("granted", node=node, tenant=tenant, job=job, count=len(reply.leases), at=now)
    if isinstance(reply, ReleaseReply) and reply.released:
        return Event("released", node=node, tenant=tenant, count=len(reply.released), at=now)
    return None
