"""A tenant's quota in the quota bucket: each node's reservation of VRAM for it."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from .common import PROTOCOL_VERSION, ge0


@attrs.frozen
class Reservation:
    """One node's hold on a tenant's quota: VRAM it may lease to the tenant until `until`."""

    reserved_bytes: int = attrs.field(validator=ge0)
    # Unix seconds; past it, no node counts this hold (its node may have crashed).
    until: float


@attrs.frozen
class QuotaReservations:
    """Value of a tenant's key in the quota bucket: each node's reservation, by node."""

    nodes: Mapping[str, Reservation] = attrs.field(factory=dict)
    v: int = PROTOCOL_VERSION

    def held_bytes(self, now: float, besides: str = "") -> int:
        """Bytes reserved by the nodes other than `besides` whose holds last past `now`."""
        return sum(
            r.reserved_bytes for n, r in self.nodes.items() if n != besides and r.until > now
        )
