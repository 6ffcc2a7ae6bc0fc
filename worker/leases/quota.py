"""QuotaBook: strict fleet-wide VRAM quotas, reserved by compare-and-set in the quota bucket.

A tenant with a quota has one key in `<prefix>_quota`, whose value (QuotaReservations) maps
each node to the bytes it holds for the tenant and until when. Before granting, a node reads
the key, caps its grant so that the other nodes' live reservations plus its own stay within
the quota, and writes its larger reservation only if no one wrote the key since it read it
(KV `update(last=revision)`). The server thereby orders the nodes' grants to one tenant, and
the fleet never holds more than the quota, however many nodes the tenant asks at once.

A reservation lasts until the latest expiry of the node's leases for the tenant plus a clock
margin, so a crashed node's reservation lapses by itself. A node writes it down on release or
a short grant, and extends it before renewing leases. The caller holds `lock(tenant)` from the
reservation to the ledger change, so no write in between can forget a pending grant.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

import attrs
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from vramfabric.broker import buckets
from vramfabric.broker.codec import decode, encode
from vramfabric.broker.errors import LeaseDenied, VramfabricError
from vramfabric.broker.messages import Lease, QuotaReservations, Reservation
from vramfabric.broker.retrying import CallRetry
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.tenants import TenantPolicy

from .ledger import SliceLedger

log = logging.getLogger(__name__)

T = TypeVar("T")

QUOTA = "quota"
# Nodes' wall clocks must agree within this: a reservation counts this long past its leases.
CLOCK_MARGIN_S = 1.0
# A compare-and-set conflict means another node wrote the tenant's key since we read it:
# progress, not a failure, so we read it again at once, with no pause (not CallRetry, whose
# pauses are for an unreachable server). Bounded, since a node serves one tenant's lease
# requests one at a time (under its lock); each round loses only to a write of another node.
CAS_ROUNDS = 16

# What a write means to do, given the key's value and the wall clock: this node's new
# reservation (None: write nothing) and what to return.
Plan = Callable[[QuotaReservations, float], tuple[Reservation | None, T]]


@attrs.define
class QuotaBook:
    """One node's reservations of its tenants' quotas in the quota bucket."""

    kv: KeyValue
    ledger: SliceLedger
    policy: TenantPolicy
    call_retry: CallRetry
    _locks: dict[str, asyncio.Lock] = attrs.field(factory=dict, init=False)

    def applies(self, tenant: str) -> bool:
        """Whether the tenant has a quota (only those pay the round trips)."""
        return self.policy.quota_bytes(tenant) is not None

    def lock(self, tenant: str) -> asyncio.Lock:
        """Held from a reservation to the ledger change it stands for."""
        return self._locks.setdefault(tenant, asyncio.Lock())

    async def reserve(
        self, tenant: str, slice_bytes: int, count: int, ttl_s: float, wall: float
    ) -> int:
        """Reserve up to `count` more slices for the tenant here; return how many fit."""
        quota = self._quota(tenant)
        until = wall + min(ttl_s, self.ledger.max_ttl_s)

        def plan(book: QuotaReservations, now: float) -> tuple[Reservation | None, int]:
            held, last = self._held(tenant)
            room = quota - book.held_bytes(now, besides=self.ledger.node) - held
            n = min(count, max(0, room // slice_bytes))
            if n == 0:
                return None, 0
            return Reservation(held + n * slice_bytes, max(last, until) + CLOCK_MARGIN_S), n

        return await self._cas(tenant, plan, wall)

    async def renew(
        self, tenant: str, renewing: Iterable[Lease], ttl_s: float, wall: float
    ) -> list[str]:
        """Extend the reservation to cover renewing `renewing`; return the ids that do not fit.

        They fit unless the reservation lapsed meanwhile (a lost server, clocks apart) and
        other nodes took its room: then the caller ends them instead (idle ones first).
        """
        quota = self._quota(tenant)
        mine = sorted(renewing, key=lambda lease: self.ledger.is_busy(lease.lease_id))
        until = wall + min(ttl_s, self.ledger.max_ttl_s)

        def plan(book: QuotaReservations, now: float) -> tuple[Reservation | None, list[str]]:
            held, last = self._held(tenant, frozenset(lease.lease_id for lease in mine))
            room = quota - book.held_bytes(now, besides=self.ledger.node)
            over: list[str] = []
            for lease in mine:
                if held <= room or self.ledger.is_busy(lease.lease_id):
                    break  # a busy lease keeps its VRAM until its chunk ends anyway
                held -= lease.slice_bytes
                over.append(lease.lease_id)
            kept = len(over) < len(mine)
            end = max(last, until if kept else 0.0)
            return Reservation(held, end + CLOCK_MARGIN_S), over

        return await self._cas(tenant, plan, wall)

    async def settle(self, tenant: str, wall: float) -> None:
        """Write the reservation down to what this node holds (after a release or short grant).

        Best effort: a reservation left too large only denies too much, and lapses by itself.
        """

        def plan(book: QuotaReservations, _now: float) -> tuple[Reservation | None, None]:
            held, last = self._held(tenant)
            mine = Reservation(held, last + CLOCK_MARGIN_S if held else 0.0)
            if book.nodes.get(self.ledger.node, Reservation(0, 0.0)) == mine:
                return None, None  # nothing to write down
            return mine, None

        try:
            await self._cas(tenant, plan, wall)
        except VramfabricError as exc:  # the release stands; the reservation lapses alone
            log.warning("quota reservation not lowered tenant=%s error=%s", tenant, exc)

    def _quota(self, tenant: str) -> int:
        quota = self.policy.quota_bytes(tenant)
        if quota is None:
            raise ValueError(f"tenant {tenant!r} has no quota")
        return quota

    def _held(self, tenant: str, renewing: frozenset[str] = frozenset()) -> tuple[int, float]:
        """Bytes held here for the tenant, and the latest expiry of the leases not renewing."""
        held, last = 0, 0.0
        for lease in self.ledger.holding():
            if lease.tenant == tenant:
                held += lease.slice_bytes
                if lease.lease_id not in renewing:
                    last = max(last, lease.expires_at)
        return held, last

    async def _cas(self, tenant: str, plan: Plan[T], wall: float) -> T:
        """Read the tenant's key, apply `plan`, write it back if no one wrote meanwhile."""
        for _round in range(CAS_ROUNDS):
            book, revision = await self.call_retry.call(
                lambda: self._read(tenant), what=f"read quota of {tenant}"
            )
            mine, out = plan(book, wall)
            if mine is None:
                return out
            # Holds that lapsed are dropped: a crashed node's entry must not stay forever.
            nodes = {n: r for n, r in book.nodes.items() if r.until > wall}
            nodes.pop(self.ledger.node, None)
            if mine.reserved_bytes:
                nodes[self.ledger.node] = mine
            value = encode(QuotaReservations(nodes=nodes))
            written = await self.call_retry.call(
                functools.partial(self._write, tenant, value, revision),
                what=f"reserve quota of {tenant}",
            )
            if written:
                log.debug("quota reserved tenant=%s bytes=%d", tenant, mine.reserved_bytes)
                return out
        raise LeaseDenied(self.ledger.node, f"quota of {tenant} busy: {CAS_ROUNDS} writes lost")

    async def _read(self, tenant: str) -> tuple[QuotaReservations, int]:
        """The tenant's reservations and their revision (0: no key yet)."""
        try:
            entry = await self.kv.get(tenant)
        except nats.js.errors.KeyNotFoundError:
            return QuotaReservations(), 0
        if not entry.value:
            return QuotaReservations(), entry.revision or 0
        return decode(QuotaReservations, entry.value), entry.revision or 0

    async def _write(self, tenant: str, value: bytes, revision: int) -> bool:
        """Write if the key is still at `revision` (0: absent); False if another node wrote."""
        try:
            # A retry after a lost reply also lands here: the next round reads our own write.
            await self.kv.update(tenant, value, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True


async def open_book(
    js: JetStreamContext, broker: BrokerSettings, ledger: SliceLedger, policy: TenantPolicy
) -> QuotaBook | None:
    """The node's QuotaBook on the quota bucket; None when no tenant has a quota."""
    if all(rules.quota_bytes is None for rules in policy.tenants.values()):
        return None
    kv = await buckets.quota_bucket(js, broker)
    return QuotaBook(kv, ledger, policy, broker.call_retry)
