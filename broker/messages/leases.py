"""The lease service's requests and replies: acquire, renew, release, held, and errors."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ..errors import ErrorKind
from .common import PROTOCOL_VERSION, gt0, is_token

# Lease ids per renew or release request: a node serves one tenant's requests in turn with
# others', so one request's work is what another tenant's request may wait for (a batch of
# 10,000 ids took 19 ms to serve here, 1,000 took 2.4 ms). Coordinators send batches.
MAX_LEASE_IDS = 250
# Leases per acquire request: a grant of this many fits in one reply.
MAX_LEASE_COUNT = 5_000


@attrs.frozen
class Lease:
    """A granted slice of one GPU, held for one job until `expires_at` (unix seconds)."""

    lease_id: str
    node: str
    gpu: int
    slice_bytes: int
    job: str
    tenant: str
    expires_at: float

    def expired(self, now: float) -> bool:
        """Whether the lease is past its expiry at unix time `now`."""
        return now >= self.expires_at


@attrs.frozen
class LeaseRequest:
    """Ask one node for up to `count` slices of `slice_bytes` for `job`.

    `request_id` makes the request idempotent: a retry after a lost reply gets the same grant.
    The tenant is not a field: it is read from the subject, which the server's permissions guard.
    """

    request_id: str = attrs.field(validator=is_token)
    job: str = attrs.field(validator=is_token)
    count: int = attrs.field(validator=[gt0, attrs.validators.le(MAX_LEASE_COUNT)])
    slice_bytes: int = attrs.field(validator=gt0)
    ttl_s: float = attrs.field(validator=[gt0, attrs.validators.le(86_400)])
    v: int = PROTOCOL_VERSION


@attrs.frozen
class LeaseGrant:
    """A node's answer to a LeaseRequest: the leases it granted, or why it granted none."""

    node: str
    leases: tuple[Lease, ...]
    denied: str | None = None
    # With a denial while tenants wait here: how many of them stand before the asker.
    ahead: int | None = None
    v: int = PROTOCOL_VERSION


@attrs.frozen
class RenewRequest:
    """Extend a batch of leases on one node by `ttl_s` from now."""

    lease_ids: tuple[str, ...] = attrs.field(validator=attrs.validators.max_len(MAX_LEASE_IDS))
    ttl_s: float = attrs.field(validator=[gt0, attrs.validators.le(86_400)])
    v: int = PROTOCOL_VERSION


@attrs.frozen
class RenewReply:
    """New expiry per renewed lease; `unknown` lists leases the node no longer holds.

    `revoked` lists leases the node took back (fair share, quota), at this renewal or since
    the last one, whatever their TTL: they are gone like the unknown ones; `reason` says why.
    """

    expires_at: Mapping[str, float]
    unknown: tuple[str, ...] = ()
    revoked: tuple[str, ...] = ()
    reason: str = ""
    v: int = PROTOCOL_VERSION


@attrs.frozen
class ReleaseRequest:
    """Give a batch of leases on one node back now."""

    lease_ids: tuple[str, ...] = attrs.field(validator=attrs.validators.max_len(MAX_LEASE_IDS))
    v: int = PROTOCOL_VERSION


@attrs.frozen
class ReleaseReply:
    """Which leases were released and which the node did not hold."""

    released: tuple[str, ...]
    unknown: tuple[str, ...] = ()
    v: int = PROTOCOL_VERSION


@attrs.frozen
class HeldRequest:
    """Ask one node for the asking tenant's leases there, by job (the tenant is the subject's)."""

    v: int = PROTOCOL_VERSION


@attrs.frozen
class HeldReply:
    """The asking tenant's leases on one node, counted per job id."""

    jobs: Mapping[str, int]
    v: int = PROTOCOL_VERSION


@attrs.frozen
class ErrorReply:
    """The reply to a request that could not be served, naming the error class."""

    kind: ErrorKind
    error: str
    v: int = PROTOCOL_VERSION
