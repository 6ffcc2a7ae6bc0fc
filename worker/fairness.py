"""FleetShare: a node's view of fleet-wide usage per tenant, for the fair share.

Usage is this node's ledger plus the latest advert of every other node (they arrive on the
advert subject every heartbeat and right after each grant or release). A tenant is
*waiting* when some node recently could not give it all it asked for, for lack of room;
nodes carry the tenants they saw waiting in their adverts, so every node knows.

Under contention (another tenant waits and holds less than its weighted share), a tenant
gets no grant past its own share, and the nodes revoke, at renewal, the part of its
excess they hold: each node its proportion, so together about the excess. Revoked leases
stop at once, but a chunk running on one finishes (the slot keeps its VRAM until then).
Quotas are not judged here: adverts lag grants, so worker/quota.py reserves them in KV.
Pure: the clock is passed in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import attrs

from vramfabric.broker.messages import NodeAdvert
from vramfabric.broker.tenants import TenantPolicy

from .ledger import SliceLedger

SHARE = "share"


@attrs.define
class AdvertBook:
    """The nodes' latest adverts and when (monotonic) each was heard.

    One per agent process: nodes simulated side by side in one process share it, so each
    advert is decoded and kept once, not once per node.
    """

    node_ttl_s: float
    _adverts: dict[str, tuple[float, NodeAdvert]] = attrs.field(factory=dict, init=False)
    # How many of the kept adverts name each tenant waiting: every lease request asks who
    # waits, and reading every advert for it made 10,000 leases from 256 nodes (one process)
    # take 0.33-0.35 s instead of 0.29-0.32 s.
    _waiting: Counter[str] = attrs.field(factory=Counter, init=False)
    # No advert kept was heard before this (monotonic): none can be stale until TTL after it.
    _oldest: float = attrs.field(default=float("inf"), init=False)

    def heard(self, advert: NodeAdvert, now: float) -> None:
        """Take in a node's advert (a goodbye, with no GPUs, removes the node)."""
        self._forget(advert.node)
        if advert.gpus:
            self._adverts[advert.node] = (now, advert)
            self._waiting.update(advert.waiting)
            self._oldest = min(self._oldest, now)

    def fresh(self, now: float, besides: str) -> list[NodeAdvert]:
        """The adverts heard within the node TTL, but `besides`'s own."""
        self._expire(now)
        return [a for node, (_t, a) in self._adverts.items() if node != besides]

    def waiting(self, now: float, besides: str) -> set[str]:
        """The tenants that adverts heard within the node TTL, but `besides`'s own, name waiting."""
        self._expire(now)
        own = self._adverts.get(besides)
        mine = Counter(own[1].waiting) if own is not None else Counter[str]()
        return {tenant for tenant, n in self._waiting.items() if n > mine[tenant]}

    def _expire(self, now: float) -> None:
        """Drop the adverts heard longer than the node TTL ago (a scan only when one may be)."""
        if now - self._oldest <= self.node_ttl_s:
            return
        for node in [n for n, (t, _a) in self._adverts.items() if now - t > self.node_ttl_s]:
            self._forget(node)
        self._oldest = min((t for t, _a in self._adverts.values()), default=float("inf"))

    def _forget(self, node: str) -> None:
        kept = self._adverts.pop(node, None)
        if kept is not None and kept[1].waiting:
            self._waiting.subtract(kept[1].waiting)
            for tenant in kept[1].waiting:
                if self._waiting[tenant] <= 0:
                    del self._waiting[tenant]


@attrs.define
class FleetShare:
    """Fair-share decisions of one node, from adverts and its own ledger."""

    ledger: SliceLedger
    policy: TenantPolicy
    book: AdvertBook
    waiting_ttl_s: float
    # Tenants this node saw waiting, and until when (monotonic) that counts.
    _waiting: dict[str, float] = attrs.field(factory=dict, init=False)

    def _fresh(self, now: float) -> list[NodeAdvert]:
        return self.book.fresh(now, self.ledger.node)

    def note_waiting(self, tenant: str, now: float) -> bool:
        """The tenant asked this node for more than it could have; True if it is news."""
        news = self._waiting.get(tenant, 0.0) <= now
        self._waiting[tenant] = now + self.waiting_ttl_s
        return news

    def own_waiting(self, now: float) -> tuple[str, ...]:
        """Tenants this node saw waiting lately (carried in its advert)."""
        for tenant in [t for t, until in self._waiting.items() if until <= now]:
            del self._waiting[tenant]
        return tuple(sorted(self._waiting))

    def waiting(self, now: float) -> set[str]:
        """Tenants waiting anywhere in the fleet."""
        return set(self.own_waiting(now)) | self.book.waiting(now, self.ledger.node)

    def usage(self, now: float) -> Counter[str]:
        """VRAM bytes held per tenant over the fleet."""
        use: Counter[str] = Counter()
        for lease in self.ledger.holding():
            use[lease.tenant] += lease.slice_bytes
        for advert in self._fresh(now):
            use.update(advert.tenants)
        return use

    def capacity_bytes(self, now: float) -> int:
        """VRAM of the fleet's healthy GPUs."""
        own = sum(g.total_bytes for g in self.ledger.advert(0.0).gpus if g.healthy)
        others = sum(g.total_bytes for a in self._fresh(now) for g in a.gpus if g.healthy)
        return own + others

    def shares(self, now: float, asking: str | None = None) -> dict[str, float]:
        """Each active tenant's weighted share of the fleet in bytes.

        Active: holding VRAM or waiting anywhere, plus `asking`, the tenant asking now.
        """
        use = self.usage(now)
        active = {t for t, n in use.items() if n > 0} | self.waiting(now)
        if asking is not None:
            active.add(asking)
        total = sum(self.policy.weight(t) for t in active)
        capacity = self.capacity_bytes(now)
        return {t: capacity * self.policy.weight(t) / total for t in active}

    def _contended(self, tenant: str, now: float) -> tuple[Counter[str], dict[str, float]] | None:
        """Usage and shares when another waiting tenant is below its share, else None."""
        waiting = self.waiting(now) - {tenant}
        if not waiting:
            return None
        use, shares = self.usage(now), self.shares(now, asking=tenant)
        if any(use[w] < shares[w] for w in waiting):
            return use, shares
        return None

    def grant_cap(self, tenant: str, slice_bytes: int, count: int, now: float) -> tuple[int, str]:
        """How many of `count` slices the fair share allows now, and SHARE if it limits (or "")."""
        cap, reason = count, ""
        contended = self._contended(tenant, now)
        if contended is not None:
            use, shares = contended
            room = max(0, int((shares[tenant] - use[tenant]) // slice_bytes))
            if room < cap:
                cap, reason = room, SHARE
        return cap, reason

    def to_revoke(self, tenant: str, lease_ids: Iterable[str], now: float) -> list[str]:
        """Of the leases a tenant renews here, those to revoke: this node's part of its excess."""
        contended = self._contended(tenant, now)
        if contended is None:
            return []
        use, shares = contended
        excess = use[tenant] - shares[tenant]
        mine = [
            lease
            for i in lease_ids
            if (lease := self.ledger.get(i)) is not None
            and lease.tenant == tenant
            and self.ledger.is_live(i, now)
        ]
        local = sum(lease.slice_bytes for lease in self.ledger.holding() if lease.tenant == tenant)
        if excess <= 0 or not mine or not local:
            return []
        # This node's proportion of the excess, in whole slices, rounded to nearest: the
        # nodes together revoke the excess within half a slice per node.
        part = round(excess * local / use[tenant] / mine[0].slice_bytes)
        # Idle leases first: their VRAM comes back at once, a busy one's after its chunk.
        mine.sort(key=lambda lease: self.ledger.is_busy(lease.lease_id))
        return [lease.lease_id for lease in mine[:part]]
