"""A tenant's account limits: what its NATS account may store, open and send.

Each tenant has an account of its own (broker/auth.py), and the server holds it to these
limits: JetStream file and memory bytes, streams and consumers, connections, subscriptions
and payload. The fabric's own streams for the tenant (work, results, dead letters, the
kernels and outputs stores, the jobs bucket) live in that account and count against them,
so the defaults leave room for its ordinary jobs. The fabric's account (workers, operator,
adverts) has no limits. Set per tenant or for all in the tenants file's `[defaults]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .settings import parse_size

# -1 is nats-server's "no limit".
UNLIMITED = -1

# The tenants file's keys, by field: sizes take `1GiB`, counts a whole number.
SIZE_KEYS = {"storage": "storage_bytes", "memory_storage": "memory_storage_bytes"}
COUNT_KEYS = {
    "streams": "streams",
    "consumers": "consumers",
    "connections": "connections",
    "subscriptions": "subscriptions",
}
KEYS = frozenset({*SIZE_KEYS, *COUNT_KEYS, "payload"})


@attrs.frozen
class AccountLimits:
    """One tenant account's limits (-1: none).

    Defaults are sized for a shared fleet: a 1,000-chunk job's work, results and outputs
    take a few MiB to a few hundred MiB; the fabric makes 6 streams per tenant and a job a
    few consumers; a coordinator holds a handful of connections.
    """

    storage_bytes: int = 4 * 2**30
    memory_storage_bytes: int = 256 * 2**20
    streams: int = 32
    consumers: int = 1024
    connections: int = 256
    subscriptions: int = 65536
    # The server's default max_payload: nothing the fabric sends is larger.
    payload_bytes: int = 2**20

    def jetstream(self) -> dict[str, object]:
        """The account's `jetstream` block in nats-server's config."""
        return {
            "max_file": self.storage_bytes,
            "max_mem": self.memory_storage_bytes,
            "max_streams": self.streams,
            "max_consumers": self.consumers,
        }

    def limits(self) -> dict[str, object]:
        """The account's `limits` block in nats-server's config."""
        return {
            "max_conn": self.connections,
            "max_subs": self.subscriptions,
            "max_payload": self.payload_bytes,
        }


DEFAULT_LIMITS = AccountLimits()


def parse_limits(body: Mapping[str, Any], base: AccountLimits, where: str) -> AccountLimits:
    """`base` with the limit keys of `body` applied; ValueError naming `where` and the key."""
    changes: dict[str, int] = {}
    for key, value in body.items():
        if key not in KEYS:
            continue
        try:
            changes[_field(key)] = _value(key, value)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"[{where}] {key}: {exc}") from None
    return attrs.evolve(base, **changes)


def _field(key: str) -> str:
    if key == "payload":
        return "payload_bytes"
    return SIZE_KEYS.get(key) or COUNT_KEYS[key]


def _value(key: str, value: Any) -> int:
    if value == "unlimited" or value == UNLIMITED:
        if key == "payload":
            raise ValueError("payload cannot be unlimited (the server's max_payload bounds it)")
        return UNLIMITED
    if isinstance(value, bool):
        raise ValueError(f"not a limit: {value!r}")
    if key in COUNT_KEYS:
        if not isinstance(value, int) or value < 0:
            raise ValueError(f'not a count: {value!r} (a whole number, or "unlimited")')
        return value
    return parse_size(str(value))
