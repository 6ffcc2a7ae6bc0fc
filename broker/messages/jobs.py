"""A job and its chunks on the wire: the spec, a chunk, its result, events, the run record."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import attrs
import msgpack

from ..errors import ErrorKind
from ..retry import RetryPolicy
from ..subjects import token
from .common import PROTOCOL_VERSION, ge0, gt0, is_token

# Kinds of work a job runs: a kernel in the workers' registry, a Python callable, or a CUDA
# kernel (both of the latter uploaded to the kernels object store by digest).
KERNEL_KINDS = ("builtin", "python", "cuda")


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

    tenant: str = attrs.field(validator=is_token)
    kernel: str
    kernel_digest: str
    n_chunks: int = attrs.field(validator=[gt0, attrs.validators.le(10_000_000)])
    args: Mapping[str, Any] = attrs.field(factory=dict)
    inputs_digest: str = ""
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    ack_wait_s: float = attrs.field(default=30.0, validator=gt0)
    kernel_kind: str = attrs.field(default="builtin", validator=attrs.validators.in_(KERNEL_KINDS))
    python: str = ""
    timeout_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional([gt0, attrs.validators.le(86_400)])
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

    job: str = attrs.field(validator=is_token)
    index: int = attrs.field(validator=ge0)
    input: bytes
    v: int = PROTOCOL_VERSION


@attrs.frozen
class ChunkResult:
    """The final outcome of one chunk: output bytes, or the error that ended it.

    A large output travels in the tenant's outputs object store instead: `output_ref` names
    the object and `output` is None.
    """

    job: str
    index: int = attrs.field(validator=ge0)
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

    job: str = attrs.field(validator=is_token)
    kernel: str
    state: str = attrs.field(validator=attrs.validators.in_(JOB_STATES))
    started_at: float
    finished_at: float = 0.0
    n_ok: int = attrs.field(default=0, validator=ge0)
    n_failed: int = attrs.field(default=0, validator=ge0)
    value: str | None = None
    v: int = PROTOCOL_VERSION
    # The job's chunk count, so `jobs` lists from the records alone: 0 in records of older
    # versions, and the largest count (10,000,000) while a streamed job's inputs last.
    n_chunks: int = attrs.field(default=0, validator=ge0)
    # The uploaded work the job runs (JobSpec.kernel_digest): blobs no record names are
    # collected (coordinator/jobs/collect.py). Empty in records of older versions.
    kernel_digest: str = ""
