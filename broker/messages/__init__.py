"""Wire types: frozen attrs classes that travel as msgpack (see codec.py and docs/protocol.md).

Top-level messages carry `v`, the protocol version; nested types (GpuState, Lease) do not.
Validators here check meaning (counts, sizes, tokens); codec.py checks types. By concept:
nodes.py (adverts), leases.py (the lease service), jobs.py (specs, chunks, results,
records), quota.py (quota reservations), common.py (the version, validators). Import them
from here: `from vramfabric.broker.messages import ...`.
"""

from __future__ import annotations

from .common import PROTOCOL_VERSION
from .jobs import JOB_STATES, KERNEL_KINDS, Chunk, ChunkResult, Event, JobRecord, JobSpec
from .leases import (
    MAX_LEASE_COUNT,
    MAX_LEASE_IDS,
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
)
from .nodes import SIMULATED_MODEL, GpuState, NodeAdvert, round_up
from .quota import QuotaReservations, Reservation

__all__ = [
    "JOB_STATES",
    "KERNEL_KINDS",
    "MAX_LEASE_COUNT",
    "MAX_LEASE_IDS",
    "PROTOCOL_VERSION",
    "SIMULATED_MODEL",
    "Chunk",
    "ChunkResult",
    "ErrorReply",
    "Event",
    "GpuState",
    "HeldReply",
    "HeldRequest",
    "JobRecord",
    "JobSpec",
    "Lease",
    "LeaseGrant",
    "LeaseRequest",
    "NodeAdvert",
    "QuotaReservations",
    "ReleaseReply",
    "ReleaseRequest",
    "RenewReply",
    "RenewRequest",
    "Reservation",
    "round_up",
]
