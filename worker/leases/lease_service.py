"""Lease request handlers: acquire, renew, release and held on `vf.lease.*.<node>.*`.

The tenant comes from the subject (the server's permissions guard it), never the payload.
Every request gets a reply: the answer, or an ErrorReply saying what was wrong with it. A
request with no reply subject, or one that is not an inbox, is refused unanswered. Each
tenant's requests wait in a bounded queue of their own (worker/leases/lease_intake.py); one past
the bound is refused at once as `busy`, so a tenant's flood delays others by about one of
its requests. `held` tells a tenant its own leases here by job (adverts carry no job ids).
A tenant with a quota is served under its QuotaBook lock: the reservation in KV comes
first, the ledger change after it, so no node grants past the reservation it wrote. The
fair share takes leases back at renewals and, through `reclaim`, at every heartbeat;
`reclaim` also takes back an interactive block's lease whose slot ran no call for
`gpu_idle_s` (both in keeper.py, LeaseKeeper, which LeaseService extends).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import attrs
from nats.aio.msg import Msg

from vramfabric.broker.codec import decode
from vramfabric.broker.errors import InvalidMessage, LeaseDenied, VramfabricError
from vramfabric.broker.messages import (
    ErrorReply,
    HeldReply,
    HeldRequest,
    Lease,
    LeaseGrant,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewReply,
    RenewRequest,
    round_up,
)

from .keeper import LeaseKeeper
from .lease_intake import LeaseIntake, Reply
from .quota import QUOTA

log = logging.getLogger(__name__)


@attrs.define
class LeaseService(LeaseKeeper):
    """Serves one node's lease requests against its ledger."""

    def __attrs_post_init__(self) -> None:
        self._intake = LeaseIntake(
            self.subjects, self.node, self.metrics, self.answer, self.publish, self.queue_limit
        )

    async def handle(self, msg: Msg) -> None:
        """The lease subscription's callback: queue the request, or refuse it at once."""
        await self._intake.handle(msg)

    async def close(self) -> None:
        """Stop serving: queued requests are dropped (their askers time out)."""
        await self._intake.close()
        await asyncio.gather(*self._settling, return_exceptions=True)

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
    ) -> LeaseGrant | RenewReply | ReleaseReply | HeldReply:
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
        if op == "held":
            decode(HeldRequest, data)
            held = Counter(x.job for x in self.ledger.holding() if x.tenant == tenant)
            return HeldReply(jobs=dict(held))
        ids = decode(ReleaseRequest, data).lease_ids
        if not self._strict(tenant):
            return self._release(ids, tenant)
        async with self._book.lock(tenant):
            reply = self._release(ids, tenant)
            if reply.released:
                await self._book.settle(tenant, wall)
        return reply

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
            if not grant.leases:
                grant = attrs.evolve(grant, ahead=self.fair.place(tenant, now))
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
        place = self.fair.place(tenant, time.monotonic())
        return LeaseGrant(node=self.node, leases=(), denied=reason, ahead=place)

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

    def _live(self, tenant: str, lease_ids: tuple[str, ...] | list[str], now: float) -> list[Lease]:
        return [
            lease
            for i in lease_ids
            if (lease := self.ledger.get(i)) is not None
            and lease.tenant == tenant
            and self.ledger.is_live(i, now)
        ]
