"""ServiceMeter: how much a node served each tenant lately, for taking turns.

Service is VRAM held over time (byte-seconds), plus a turn's worth of a slice for every
grant, so a tenant whose calls each hold a slice for a few milliseconds still counts as
served. It decays with a half-life, so what counts is recent service: a tenant that waits
sees its service fall while the holders' grows, and comes first when a slice frees. Nodes
carry their meter in adverts (`NodeAdvert.served`), and each sums the fleet's. Pure: the
clock is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

# Service below this (byte-seconds) is forgotten: about a MiB held for a second.
_NEGLIGIBLE = float(2**20)


@attrs.define
class ServiceMeter:
    """Decayed byte-seconds of VRAM served per tenant on one node."""

    halflife_s: float
    # A grant counts as `slice_bytes * grant_s` of service at once.
    grant_s: float = 1.0
    _value: dict[str, float] = attrs.field(factory=dict, init=False)
    _at: float | None = attrs.field(default=None, init=False)

    def charge(self, tenant: str, slice_bytes: int, count: int) -> None:
        """Count a grant of `count` slices of `slice_bytes` to the tenant."""
        added = float(slice_bytes) * count * self.grant_s
        self._value[tenant] = self._value.get(tenant, 0.0) + added

    def tick(self, held_bytes: Mapping[str, int], now: float) -> None:
        """Decay what was served and add what is held now, for the time since the last tick."""
        dt = 0.0 if self._at is None else max(0.0, now - self._at)
        self._at = now
        keep = 0.5 ** (dt / self.halflife_s)
        for tenant in list(self._value):
            value = self._value[tenant] * keep
            if value < _NEGLIGIBLE and not held_bytes.get(tenant):
                del self._value[tenant]
            else:
                self._value[tenant] = value
        for tenant, held in held_bytes.items():
            if held:
                self._value[tenant] = self._value.get(tenant, 0.0) + held * dt

    def values(self) -> dict[str, float]:
        """Service per tenant as of the last tick and grant (what the advert carries)."""
        return dict(self._value)

    def get(self, tenant: str) -> float:
        """One tenant's service here."""
        return self._value.get(tenant, 0.0)
