"""Revoked: leases a node took back, and why, kept so that their holders' renewals say so.

A lease taken back for the fair share is gone from the ledger at once; its holder learns it
at its next renewal, which lists it in `RenewReply.revoked` with the reason rather than as
unknown. The memory is bounded: the oldest entries go first.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

# Entries kept: renewals come every third of a TTL, so a holder asks long before this many
# more leases are taken back on one node.
KEEP = 65_536


@attrs.define
class Revoked:
    """Whose and why, for each of the last `keep` leases taken back."""

    keep: int = KEEP
    _why: dict[str, tuple[str, str]] = attrs.field(factory=dict, init=False)

    def add(self, tenant: str, lease_ids: Iterable[str], reason: str) -> None:
        """Remember that these leases of the tenant were taken back, and why."""
        for lease_id in lease_ids:
            self._why[lease_id] = (tenant, reason)
        while len(self._why) > self.keep:
            del self._why[next(iter(self._why))]

    def pop(self, lease_id: str, tenant: str) -> str | None:
        """Why the tenant's lease was taken back (then forgotten), or None if it was not.

        Only its own tenant hears it: the reason names the tenant and what it held.
        """
        entry = self._why.get(lease_id)
        if entry is None or entry[0] != tenant:
            return None
        del self._why[lease_id]
        return entry[1]
