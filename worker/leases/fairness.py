"""FleetShare: a node's view of fleet-wide usage per tenant, for the fair share.

Usage is this node's ledger plus the latest advert of every other node (they arrive on the
advert subject every heartbeat and right after each grant or release). A tenant is
*waiting* when some node recently could not give it all it asked for; nodes carry the
tenants they saw waiting in their adverts, so every node knows.

Under contention (another tenant waits and holds less than its weighted share), a tenant
gets no grant past its own share, except one slice when it is its turn (worker/leases/turns.py):
when tenants outnumber slices a share is less than a slice, and rounded down it would be
nothing. The nodes take back, at renewals and at every heartbeat whatever TTL a lease has,
their part of a tenant's excess over its share (all of it, split over the nodes that hold
it), and a slice a tenant has held for a turn (`turn_s`) while a waiting tenant stands
before it. A node that frees a slice keeps it, for a grace period, for the waiting tenant
whose turn it is. Quotas are not judged here: adverts lag grants, so worker/leases/quota.py
reserves them in KV. Pure: the clock is passed in.
"""

from __future__ import annotations

from collections import Counter

import attrs

from vramfabric.broker.messages import Lease, NodeAdvert, round_up
from vramfabric.broker.tenants import TenantPolicy

from ..node.advert_book import AdvertBook
from ..node.settings import WorkerSettings
from .ledger import SliceLedger
from .served import ServiceMeter
from .turns import ahead, node_part, standing

SHARE = "share"
TURN = "turn"
_GIB = float(2**30)


@attrs.frozen
class ShareTiming:
    """How long the fair share's states last (seconds)."""

    # A tenant a node could not serve in full counts as waiting this long.
    waiting_ttl_s: float = 10.0
    # A tenant above its share by less than a slice keeps a slice this long before its turn
    # passes to a waiting tenant that stands before it.
    turn_s: float = 30.0
    # A node keeps a freed slice this long for the waiting tenant whose turn it is.
    grace_s: float = 3.0
    # After taking leases back from a tenant, a node lets adverts catch up this long before
    # it takes more of that tenant's (they would still count what other nodes took).
    settle_s: float = 2.0
    # Recent service halves in this time (worker/leases/served.py).
    halflife_s: float = 60.0

    @classmethod
    def of(cls, settings: WorkerSettings) -> ShareTiming:
        """The timing of a node: grace and settling from its heartbeat."""
        beat = settings.heartbeat_s
        return cls(
            waiting_ttl_s=settings.waiting_ttl_s,
            turn_s=settings.turn_s,
            grace_s=max(1.0, 3 * beat),
            settle_s=2 * beat,
            halflife_s=settings.service_halflife_s,
        )


@attrs.frozen
class Contention:
    """Usage and shares in bytes, and the other waiting tenants below their share."""

    use: Counter[str]
    shares: dict[str, float]
    below: list[str]


@attrs.define
class FleetShare:
    """Fair-share decisions of one node, from adverts and its own ledger."""

    ledger: SliceLedger
    policy: TenantPolicy
    book: AdvertBook
    timing: ShareTiming = attrs.field(factory=ShareTiming)
    meter: ServiceMeter = attrs.field(init=False)
    # Tenants this node saw waiting, and until when (monotonic) that counts.
    _waiting: dict[str, float] = attrs.field(factory=dict, init=False)
    # Tenants this node keeps a freed slice for (their turn), and since when.
    _deferred: dict[str, float] = attrs.field(factory=dict, init=False)
    # When this node last took leases back from each tenant.
    _took_back: dict[str, float] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self.meter = ServiceMeter(self.timing.halflife_s)

    def _fresh(self, now: float) -> list[NodeAdvert]:
        return self.book.fresh(now, self.ledger.node)

    def note_waiting(self, tenant: str, now: float) -> bool:
        """The tenant asked this node for more than it could have; True if it is news."""
        news = self._waiting.get(tenant, 0.0) <= now
        self._waiting[tenant] = now + self.timing.waiting_ttl_s
        return news

    def satisfied(self, tenant: str) -> None:
        """The tenant got all it asked for here: it no longer waits, as far as this node knows."""
        self._waiting.pop(tenant, None)

    def own_waiting(self, now: float) -> tuple[str, ...]:
        """Tenants this node saw waiting lately (carried in its advert)."""
        for tenant in [t for t, until in self._waiting.items() if until <= now]:
            del self._waiting[tenant]
        return tuple(sorted(self._waiting))

    def advert_facts(self, now: float) -> dict[str, object]:
        """What the node's advert says for the fair share; called once per heartbeat."""
        held: Counter[str] = Counter()
        for lease in self.ledger.holding():
            held[lease.tenant] += lease.slice_bytes
        self.meter.tick(held, now)
        waiting = self.own_waiting(now)
        # A turn kept for a tenant that no longer waits is forgotten.
        fleet = set(waiting) | self.book.waiting(now, self.ledger.node)
        for tenant in [t for t in self._deferred if t not in fleet]:
            del self._deferred[tenant]
        return {"waiting": waiting, "served": self.meter.values()}

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

    def holdings(self, tenant: str, now: float) -> dict[str, int]:
        """VRAM bytes the tenant holds on each node."""
        own = sum(x.slice_bytes for x in self.ledger.holding() if x.tenant == tenant)
        held = {a.node: a.tenants.get(tenant, 0) for a in self._fresh(now)}
        held[self.ledger.node] = own
        return held

    def served(self, tenant: str, now: float) -> float:
        """The tenant's recent service over the fleet (byte-seconds, decayed)."""
        return self.meter.get(tenant) + self.book.served(tenant, now, self.ledger.node)

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

    def _contended(self, tenant: str, now: float) -> Contention | None:
        """Usage and shares when another waiting tenant is below its share, else None."""
        waiting = self.waiting(now) - {tenant}
        if not waiting:
            return None
        use, shares = self.usage(now), self.shares(now, asking=tenant)
        below = sorted(w for w in waiting if use[w] < shares[w])
        return Contention(use, shares, below) if below else None

    def _standing(self, tenant: str, use_bytes: float, now: float) -> tuple[float, float, str]:
        return standing(tenant, use_bytes, self.served(tenant, now), self.policy.weight(tenant))

    def grant_cap(self, tenant: str, slice_bytes: int, count: int, now: float) -> tuple[int, str]:
        """How many of `count` slices the fair share allows now, and why it limits them ("")."""
        self._deferred.pop(tenant, None)  # it asks here: a turn kept for it is taken now
        view = self._contended(tenant, now)
        if view is None:
            return count, ""
        use, share = view.use[tenant], view.shares[tenant]
        room = int((share - use) // slice_bytes)
        if room >= count:
            return count, ""
        if room >= 1:
            return room, SHARE
        if use >= share:
            return 0, SHARE
        # Below its share by less than a slice: one slice, if no one stands before it.
        before = self._before(tenant, view, now)
        if not before:
            return 1, SHARE if count > 1 else ""
        if self._has_room(slice_bytes):
            for other in before:
                self._deferred.setdefault(other, now)
        return 0, f"{TURN}: {len(before)} waiting tenant(s) first"

    def place(self, tenant: str, now: float) -> int | None:
        """How many waiting tenants stand before `tenant` for a slice here (None: none wait)."""
        view = self._contended(tenant, now)
        return None if view is None else len(self._before(tenant, view, now))

    def _before(self, tenant: str, view: Contention, now: float) -> list[str]:
        mine = self._standing(tenant, view.use[tenant], now)
        return ahead(mine, (self._standing(w, view.use[w], now) for w in self._queued(view, now)))

    def _has_room(self, slice_bytes: int) -> bool:
        """Whether a healthy GPU here could grant a slice now."""
        need = round_up(slice_bytes, self.ledger.granule_bytes)
        free = self.ledger.free_bytes
        return any(
            free(g.index) >= need for g in self.ledger.gpus if not self.ledger.problem(g.index)
        )

    def _queued(self, view: Contention, now: float) -> list[str]:
        """The waiting tenants below their share that a freed slice here is kept for.

        One kept a slice for longer than the grace period without asking here has its turn
        passed over on this node (it may wait for another node, or have gone).
        """
        grace = self.timing.grace_s
        return [w for w in view.below if now - self._deferred.get(w, now) <= grace]

    def to_revoke(self, tenant: str, leases: list[Lease], now: float) -> tuple[list[str], str]:
        """Of the tenant's live leases here, those to take back now, and why.

        This node's part of the tenant's whole slices over its share; or, when it is above
        its share by less than a slice and a waiting tenant stands before it, one lease held
        for a turn, from the node holding most of the tenant's (one node, not each). Nothing
        while a lease of the tenant's here has ended but its work still holds the VRAM: it
        counts as held until then, and taking more for it would take the excess twice.
        """
        if not leases or now - self._took_back.get(tenant, -1e18) < self.timing.settle_s:
            return [], ""
        if sum(1 for x in self.ledger.holding() if x.tenant == tenant) > len(leases):
            return [], ""
        view = self._contended(tenant, now)
        if view is None:
            return [], ""
        use, share = view.use[tenant], view.shares[tenant]
        slice_bytes = leases[0].slice_bytes
        if use <= share:
            return [], ""
        holdings = {n: b // slice_bytes for n, b in self.holdings(tenant, now).items() if b}
        # Idle leases first: their VRAM comes back at once, a busy one's when its work stops.
        order = sorted(leases, key=lambda lease: self.ledger.is_busy(lease.lease_id))
        whole = int((use - share) // slice_bytes)
        if whole:
            chosen = order[: node_part(whole, holdings, self.ledger.node)]
        elif self._turn_over(tenant, view, slice_bytes, now) and self.ledger.node == min(
            holdings, key=lambda n: (-holdings[n], n)
        ):
            turn_s = self.timing.turn_s
            chosen = [x for x in order if self.ledger.held_for(x.lease_id, now) >= turn_s][:1]
        else:
            chosen = []
        if not chosen:
            return [], ""
        self._took_back[tenant] = now
        reason = (
            f"fair share: {len(view.below)} tenant(s) wait below their share; {tenant} held "
            f"{use / _GIB:.2f} GiB over the fleet, its share is {share / _GIB:.2f} GiB"
        )
        return [x.lease_id for x in chosen], reason

    def _turn_over(self, tenant: str, view: Contention, slice_bytes: int, now: float) -> bool:
        """Whether a waiting tenant stands before this one once it gives a slice back."""
        after = self._standing(tenant, view.use[tenant] - slice_bytes, now)
        return bool(ahead(after, (self._standing(w, view.use[w], now) for w in view.below)))
