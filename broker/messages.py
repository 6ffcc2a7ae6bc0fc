"""Wire types: frozen attrs classes that travel as msgpack (see codec.py and docs/protocol.md).

Top-level messages carry `v`, the protocol version; nested types (GpuState, Lease) do not.
Validators here check meaning (counts, sizes, tokens); codec.py checks types.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import msgpack

from .errors import ErrorKind
from .retry import RetryPolicy
from .subjects import token

PROTOCOL_VERSION = 1
# Lease ids per renew or release request: a node serves one tenant's requests in turn with
# others', so one request's work is what another tenant's request may wait for (a batch of
# 10,000 ids took 19 ms to serve here, 1,000 took 2.4 ms). Coordinators send batches.
MAX_LEASE_IDS = 250
# Leases per acquire request: a grant of this many fits in one reply.
MAX_LEASE_COUNT = 5_000
# Kinds of work a job runs: a kernel in the workers' registry, a Python callable, or a CUDA
# kernel (both of the latter uploaded to the kernels object store by digest).
KERNEL_KINDS = ("builtin", "python", "cuda")
# `GpuState.model` of a simulated GPU.
SIMULATED_MODEL = "simulated"

_ge0 = attrs.validators.ge(0)
# Typed for any number: inferred from `gt(0)` it would accept int fields only.
_gt0: Callable[[Any, attrs.Attribute[Any], Any], Any] = attrs.validators.gt(0)


def _is_token(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    token(value, attr.name)


@attrs.frozen
class GpuState:
    """One GPU of a node as its advert shows it."""

    index: int = attrs.field(validator=_ge0)
    model: str
    total_bytes: int = attrs.field(validator=_ge0)
    free_bytes: int = attrs.field(validator=_ge0)
    leased_bytes: int = attrs.field(validator=_ge0)
    slice_bytes: int = attrs.field(validator=_gt0)
    healthy: bool = True
    # Why the GPU is unhealthy (NVML's ECC, retired pages or rows, XID, heat); empty if healthy.
    problem: str = ""

    def free_slices(self, slice_bytes: int) -> int:
        """How many leases of `slice_bytes` this GPU could grant now."""
        if not self.healthy:
            return 0
        return self.free_bytes // round_up(slice_bytes, self.slice_bytes)


def round_up(n_bytes: int, granule_bytes: int) -> int:
    """`n_bytes` rounded up to whole granules (the VRAM a lease really takes)."""
    return -(-n_bytes // granule_bytes) * granule_bytes


@attrs.frozen
class NodeAdvert:
    """Heartbeat of a node: its GPUs and per-tenant leased bytes."""

    node: str = attrs.field(validator=_is_token)
    gpus: tuple[GpuState, ...]
    tenants: Mapping[str, int]
    sent_at: float
    # `major.minor` of the worker's Python, and whether it runs Python callables.
    python: str = ""
    allow_code: bool = False
    # Leases held per job, keyed `<tenant>.<job>`: no longer sent (every tenant reads adverts,
    # and a job id is its tenant's alone; a tenant asks a node with HeldRequest). Kept so that
    # an older worker's advert still decodes.
    jobs: Mapping[str, int] = attrs.field(factory=dict)
    # Tenants this node lately could not give all they asked for (see docs/protocol.md).
    waiting: tuple[str, ...] = ()
    # How its executors are kept apart: "uid-per-tenant" or "shared-uid"
    # (worker/executors/containment.py).
    containment: str = ""
    v: int = PROTOCOL_VERSION
    # Whether it runs packed chunks (ChunkPack): a coordinator packs a job's chunks only while
    # every node holding its leases does, since a worker of an older version drops a pack.
    packs: bool = False
    # The registered kernels it runs, by name (built-ins and its --kernel-module ones): a
    # coordinator leases for a registered kernel only where it is listed. None: a worker of an
    # older version, which does not say (assumed to run any, as before).
    kernels: tuple[str, ...] | None = None
    # Recent service per tenant on this node (decayed byte-seconds, worker/leases/served.py): who
    # served least lately comes first when tenants outnumber slices.
    served: Mapping[str, float] = attrs.field(factory=dict)
    # Leases held per tenant on this node (counted like `tenants`).
    leases: Mapping[str, int] = attrs.field(factory=dict)

    @property
    def simulated(self) -> bool:
        """Whether the node's GPUs are simulated (NumPy on the CPU, no CUDA)."""
        return bool(self.gpus) and all(g.model == SIMULATED_MODEL for g in self.gpus)

    def free_slices(self, slice_bytes: int) -> int:
        """Leases of `slice_bytes` the node could grant now, over all healthy GPUs."""
        return sum(g.free_slices(slice_bytes) for g in self.gpus)


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

    request_id: str = attrs.field(validator=_is_token)
    job: str = attrs.field(validator=_is_token)
    count: int = attrs.field(validator=[_gt0, attrs.validators.le(MAX_LEASE_COUNT)])
    slice_bytes: int = attrs.field(validator=_gt0)
    ttl_s: float = attrs.field(validator=[_gt0, attrs.validators.le(86_400)])
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
    ttl_s: float = attrs.field(validator=[_gt0, attrs.validators.le(86_400)])
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


def _spec_digest(spec: JobSpec) -> str:
    body = msgpack.packb(
        [
            spec.tenant,
            spec.kernel,
            spec.kernel_digest,
            sorted(spec.args.items()),
            spec.n_chunks,
            spec.inputs_digest,
            # Seconds hash as float64 whether they were given as 30 or 30.0, so that every
            # client derives the same id from the same settings.
            [
                spec.retry.max_retries,
                float(spec.retry.initial_backoff_s),
                float(spec.retry.max_backoff_s),
            ],
            float(spec.ack_wait_s),
            spec.kernel_kind,
            None if spec.timeout_s is None else float(spec.timeout_s),
        ],
        use_bin_type=True,
    )
    return hashlib.sha256(body).hexdigest()[:16]


@attrs.frozen
class JobSpec:
    """A job as stored in KV: kernel, fixed args, chunk count, retry policy and deadline.

    The job id defaults to a hash of everything else in the spec (kernel, args, inputs, retry
    policy, ack wait, deadline), so running the same job twice resumes it.
    `kernel_kind` says where the work comes from: `builtin` (the workers' registry, by name
    and digest), `python` or `cuda` (the kernels object store, by `kernel_digest`).
    `python` is the client's `major.minor`, which a worker must match to run a callable.
    `timeout_s` is the per-chunk deadline (None: the worker's default).
    """

    tenant: str = attrs.field(validator=_is_token)
    kernel: str
    kernel_digest: str
    n_chunks: int = attrs.field(validator=[_gt0, attrs.validators.le(10_000_000)])
    args: Mapping[str, Any] = attrs.field(factory=dict)
    inputs_digest: str = ""
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    ack_wait_s: float = attrs.field(default=30.0, validator=_gt0)
    kernel_kind: str = attrs.field(default="builtin", validator=attrs.validators.in_(KERNEL_KINDS))
    python: str = ""
    timeout_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional([_gt0, attrs.validators.le(86_400)])
    )
    job_id: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    v: int = PROTOCOL_VERSION

    def __attrs_post_init__(self) -> None:
        """Fill in the job id from the spec's hash when none was given."""
        if not self.job_id:
            object.__setattr__(self, "job_id", _spec_digest(self))
        token(self.job_id, "job_id")


@attrs.frozen
class Chunk:
    """One unit of work: the input bytes of chunk `index` of `job`."""

    job: str = attrs.field(validator=_is_token)
    index: int = attrs.field(validator=_ge0)
    input: bytes
    v: int = PROTOCOL_VERSION


@attrs.frozen
class ChunkResult:
    """The final outcome of one chunk: output bytes, or the error that ended it.

    A large output travels in the tenant's outputs object store instead: `output_ref` names
    the object and `output` is None.
    """

    job: str
    index: int = attrs.field(validator=_ge0)
    ok: bool
    output: bytes | None = None
    output_ref: str | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
    attempt: int = 1
    node: str = ""
    lease_id: str = ""
    started_at: float = 0.0
    elapsed_s: float = 0.0
    v: int = PROTOCOL_VERSION
    # The seconds its work ran in its executor (0 where unknown): no wait for a process or a
    # slot, unlike `elapsed_s`. Packing reads it.
    cost_s: float = 0.0
    # A failed chunk's end of what it printed (stdout and stderr as one text, at most 64 KiB)
    # and of its traceback; empty where there is none (see docs/protocol.md, ChunkResult).
    printed: str = ""
    traceback: str = ""


@attrs.frozen
class Event:
    """A lease or job event for observers (`vf.events.<kind>`)."""

    kind: str
    node: str = ""
    tenant: str = ""
    job: str = ""
    count: int = 0
    at: float = 0.0
    v: int = PROTOCOL_VERSION


# States of a job run as its JobRecord shows them; all but `running` are final.
JOB_STATES = ("running", "done", "failed", "timeout", "cancelled")


@attrs.frozen
class JobRecord:
    """A job's run state, kept beside its spec in KV `vf_jobs` under `<tenant>.<job>.state`.

    The coordinator running the job writes `running` at the start and the outcome at the
    end; `vramfabric cancel` writes `cancelled`, which a running coordinator watches for.
    `value` is the aggregate as JSON text when it has one that small, else None.
    """

    job: str = attrs.field(validator=_is_token)
    kernel: str
    state: str = attrs.field(validator=attrs.validators.in_(JOB_STATES))
    started_at: float
    finished_at: float = 0.0
    n_ok: int = attrs.field(default=0, validator=_ge0)
    n_failed: int = attrs.field(default=0, validator=_ge0)
    value: str | None = None
    v: int = PROTOCOL_VERSION
    # The job's chunk count, so `jobs` lists from the records alone: 0 in records of older
    # versions, and the largest count (10,000,000) while a streamed job's inputs last.
    n_chunks: int = attrs.field(default=0, validator=_ge0)
    # The uploaded work the job runs (JobSpec.kernel_digest): blobs no record names are
    # collected (coordinator/collect.py). Empty in records of older versions.
    kernel_digest: str = ""


@attrs.frozen
class Reservation:
    """One node's hold on a tenant's quota: VRAM it may lease to the tenant until `until`."""

    reserved_bytes: int = attrs.field(validator=_ge0)
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
