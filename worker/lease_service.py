"""Lease request handlers: acquire, renew and release on `vf.lease.*.<node>.*`.

The tenant comes from the subject (the server's permissions guard it), never the payload.
Every request gets a reply: the answer, or an ErrorReply saying what was wrong with it. A
request with no reply subject, or one that is not an inbox, is refused unanswered. Each
tenant's requests wait in a bounded queue of their own (worker/lease_queues.py); one past
the bound is refused at once as `busy`, so a tenant's flood delays others by about one of
its requests. A tenant with a quota is served under its QuotaBook lock: the reservation in
KV comes first, the ledger change after it, so no node grants past the reservation it wrote.
The fair share takes leases back at renewals and, through `reclaim`, at every heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import attrs
import nats.errors
from nats.aio.msg import Msg

from vramfabric.broker.codec import decode, encode
from vramfabric.broker.errors import ErrorKind, InvalidMessage, LeaseDenied, VramfabricError
from vramfabric.broker.messages import (
    MAX_LEASE_IDS,
    ErrorReply,
    Event,
    Lease,
    LeaseGrant,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewReply,
    RenewRequest,
    round_up,
)
from vramfabric.broker.subjects import Subjects

from .fairness import FleetShare
from .lease_queues import TenantQueues
from .ledger import SliceLedger
from .metrics import WorkerMetrics
from .quota import QUOTA, QuotaBook
from .revoked import Revoked

log = logging.getLogger(__name__)

# Called after the ledger changed for (tenant, job), e.g. to start or resize a puller.
OnChange = Callable[[str, str], None]
# Core NATS publish, for events.
Publish = Callable[[str, bytes], Awaitable[None]]
Reply = LeaseGrant | RenewReply | ReleaseReply | ErrorReply
# A tenant's lease requests queued or in service on one node, unless told otherwise.
QUEUE_LIMIT = 64
# A lease request payload over this is refused unread: a batch of MAX_LEASE_IDS ids of
# 100 characters each fits (the coordinator's are 14 to 17).
MAX_REQUEST_BYTES = 32 * 1024


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
    queue_limit: int = QUEUE_LIMIT
    _queues: TenantQueues = attrs.field(init=False)
    _revoked: Revoked = attrs.field(factory=Revoked, init=False)
    _settling: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        self._queues = TenantQueues(self.queue_limit, self._serve_msg)

    async def handle(self, msg: Msg) -> None:
        """Queue one request under its tenant, or refuse it at once (the subscription callback)."""
        if not msg.reply or not self.subjects.is_inbox(msg.reply):
            # No one to answer; and answering a non-inbox would publish, with this agent's
            # rights, where the asker chose.
            self.metrics.invalid("lease.reply")
            log.debug("lease request refused: reply %r is not an inbox", msg.reply)
            return
        try:
            tenant, _node, op = self.subjects.parse_lease(msg.subject)
        except ValueError as exc:
            await self._serve_msg("", msg)  # answered as invalid, at once
            log.debug("unparsed lease subject=%s error=%s", msg.subject, exc)
            return
        if len(msg.data) > MAX_REQUEST_BYTES:
            self.metrics.invalid(f"lease.{op}")
            why = (
                f"invalid lease request: payload of {len(msg.data)} bytes exceeds "
                f"{MAX_REQUEST_BYTES} (at most {MAX_LEASE_IDS} lease ids a request)"
            )
            await self._respond(msg, ErrorReply(kind=ErrorKind.INVALID_MESSAGE, error=why))
            return
        if not self._queues.offer(tenant, msg):
            self.metrics.lease_requests_total.labels(tenant=tenant, op=op, outcome="busy").inc()
            why = (
                f"busy: node {self.node} is serving {self.queue_limit} lease requests of "
                f"tenant {tenant} already; retry when some are answered"
            )
            await self._respond(msg, ErrorReply(kind=ErrorKind.BUSY, error=why))

    async def close(self) -> None:
        """Stop serving: queued requests are dropped (their askers time out)."""
        await self._queues.close()
        await asyncio.gather(*self._settling, return_exceptions=True)

    async def _serve_msg(self, _tenant: str, msg: Msg) -> None:
        reply, tenant, outcome = await self.answer(msg.subject, msg.data)
        await self._respond(msg, reply)
        event = _event_of(reply, self.node, tenant if outcome == "ok" else "")
        if event is not None:
            await self._send(self.subjects.event(event.kind), encode(event))

    async def _respond(self, msg: Msg, reply: Reply) -> None:
        try:
            await msg.respond(encode(reply))
        except nats.errors.Error as exc:  # the asker times out; nothing changes here
            log.warning("lease reply not sent subject=%s error=%s", msg.subject, exc)

    async def _send(self, subject: str, data: bytes) -> None:
        try:
            await self.publish(subject, data)
        except nats.errors.Error as exc:  # an event for observers only: lost, logged
            log.debug("lease event not sent subject=%s error=%s", subject, exc)

    async def answer(self, subject: str, data: bytes) -> tuple[Reply, str, str]:
        """Serve one request: its reply, tenant and outcome (a bad one changes nothing)."""
        op, tenant = "unknown", ""
        t0 = time.perf_counter()
        reply: Reply
        try:
            tenant, node, op = self.subjects.parse_lease(subject)
            if node != self.node:
                raise InvalidMessage("lease subject", f"addressed to node {node!r}")
            policy = self.fair.policy
            if policy.tenants and tenant not in policy.tenants:
                raise InvalidMessage(
                    "lease subject", f"tenant {tenant!r} is not in the tenants file"
                )
            reply = await self._serve(tenant, op, data)
            outcome = "denied" if isinstance(reply, LeaseGrant) and reply.denied else "ok"
        except (InvalidMessage, ValueError) as exc:
            self.metrics.invalid(f"lease.{op}")
            log.warning("bad lease request subject=%s error=%s", subject, exc)
            kind = InvalidMessage.kind
            reply, outcome = ErrorReply(kind=kind, error=str(exc)), "invalid"
        except VramfabricError as exc:  # the quota bucket could not be read or written
            log.warning("lease request failed subject=%s error=%s", subject, exc)
            reply, outcome = ErrorReply(kind=exc.kind, error=str(exc)), "error"
        self.metrics.lease_requests_total.labels(tenant=tenant, op=op, outcome=outcome).inc()
        self.metrics.lease_request_seconds.labels(op=op).observe(time.perf_counter() - t0)
        return reply, tenant, outcome

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

    def _fair_cap(self, tenant: str, req: LeaseRequest, now: float) -> tuple[int, str]:
        """How many of the request's slices the fair share allows, and why fewer (a retry: all)."""
        if self.ledger.knows(req.request_id):
            return req.count, ""
        need = round_up(req.slice_bytes, self.ledger.granule_bytes)
        cap, reason = self.fair.grant_cap(tenant, need, req.count, now)
        if reason:
            self._waits(tenant, now)
        return cap, reason

    async def _acquire_strict(self, tenant: str, req: LeaseRequest) -> LeaseGrant:
        """Reserve the quota in KV, then grant at most what was reserved."""
        # Read after the lock: other requests may have run meanwhile.
        now, wall = time.monotonic(), time.time()
        cap, why = self._fair_cap(tenant, req, now)
        if self.ledger.knows(req.request_id) or cap == 0:
            return self._acquire(tenant, req, now, wall, (cap, why))
        need = round_up(req.slice_bytes, self.ledger.granule_bytes)
        # Never reserve more than fits here: the rest of the quota stays for other nodes.
        free = self.ledger.advert(wall).free_slices(need)
        if free == 0:
            return self._acquire(tenant, req, now, wall, (cap, why))  # the ledger says why
        try:
            cap = await self._book.reserve(tenant, need, min(cap, free), req.ttl_s, wall)
        except LeaseDenied as exc:
            return self._deny(tenant, exc.reason)
        if cap == 0:
            return self._deny(tenant, QUOTA)
        grant = self._acquire(tenant, req, time.monotonic(), wall, (cap, why))
        if len(grant.leases) < cap:
            await self._book.settle(tenant, wall)  # reserved more than the ledger gave
        return grant

    def _acquire(
        self, tenant: str, req: LeaseRequest, now: float, wall: float, cap: tuple[int, str]
    ) -> LeaseGrant:
        retry = self.ledger.knows(req.request_id)
        if not retry:  # a retry gets its first answer again
            if cap[0] == 0:
                return self._deny(tenant, cap[1])
            req = attrs.evolve(req, count=cap[0])
        grant = self.ledger.grant(req, tenant, now, wall)
        log.debug("lease request job=%s count=%d granted=%d", req.job, req.count, len(grant.leases))
        if len(grant.leases) < req.count:
            # Not all it asked for, for lack of room: it waits (the fleet learns by adverts).
            self._waits(tenant, now)
        elif not cap[1]:
            self.fair.satisfied(tenant)
        if grant.leases:
            if not retry:
                self.fair.meter.charge(tenant, grant.leases[0].slice_bytes, len(grant.leases))
            self.on_change(tenant, req.job)
        return grant

    def _deny(self, tenant: str, reason: str) -> LeaseGrant:
        # The metric's label is the reason's kind, never its free text.
        self.metrics.lease_denials_total.labels(tenant=tenant, reason=reason.split(":")[0]).inc()
        return LeaseGrant(node=self.node, leases=(), denied=reason)

    async def _renew(self, tenant: str, renew: RenewRequest, now: float, wall: float) -> RenewReply:
        revoke, why = self.fair.to_revoke(tenant, self._live(tenant, renew.lease_ids, now), now)
        if revoke:
            self._take_back(tenant, revoke, why)
        keep = list(renew.lease_ids)  # those just taken back come out as revoked
        if not self._strict(tenant):
            reply = self.ledger.renew(keep, tenant, renew.ttl_s, now, wall)
            return self._with_revoked(reply, tenant)
        async with self._book.lock(tenant):
            # The reservation is extended first: a lease never outlives the hold on its quota.
            live = self._live(tenant, keep, now)
            over = await self._book.renew(tenant, live, renew.ttl_s, wall)
            if over:
                log.warning("leases past the quota revoked tenant=%s count=%d", tenant, len(over))
                self._revoked.add(tenant, over, "quota: the tenant's reservation lapsed")
                self._release(over, tenant)
            reply = self.ledger.renew(
                [i for i in keep if i not in over], tenant, renew.ttl_s, time.monotonic(), wall
            )
        return self._with_revoked(reply, tenant)

    def _with_revoked(self, reply: RenewReply, tenant: str) -> RenewReply:
        """The reply with the leases taken back from this tenant moved from unknown to revoked."""
        why = {i: r for i in reply.unknown if (r := self._revoked.pop(i, tenant)) is not None}
        if not why:
            return reply
        unknown = tuple(i for i in reply.unknown if i not in why)
        reason = "; ".join(sorted(set(why.values())))
        return attrs.evolve(reply, unknown=unknown, revoked=tuple(why), reason=reason)

    def _live(self, tenant: str, lease_ids: tuple[str, ...] | list[str], now: float) -> list[Lease]:
        return [
            lease
            for i in lease_ids
            if (lease := self.ledger.get(i)) is not None
            and lease.tenant == tenant
            and self.ledger.is_live(i, now)
        ]

    async def reclaim(self) -> None:
        """Take back, whatever their TTL, the leases others wait for (called every heartbeat)."""
        now = time.monotonic()
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
                await self._send(self.subjects.event(event.kind), encode(event))

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
