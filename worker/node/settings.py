"""WorkerSettings: node identity, slicing, timing and limits, read from the environment once."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping

import attrs

from vramfabric.broker.settings import env_flag, env_float, env_int, env_size
from vramfabric.broker.subjects import token

from .uids import UidRange

ISOLATIONS = ("thread", "process")


def default_node_name() -> str:
    """A node name unique per process: host name plus a short random suffix."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())
    return f"{host[:40] or 'node'}-{uuid.uuid4().hex[:6]}"


# How long an interactive block may hold a slice without a call (VRAMFABRIC_GPU_IDLE_S).
GPU_IDLE_S = 120.0


@attrs.frozen
class WorkerSettings:
    """How one node agent serves its GPUs.

    `simulate` (e.g. `4x48GiB`) replaces NVML discovery with simulated GPUs run on NumPy.
    `isolation` is `thread` (one executor process per GPU and tenant, a thread per lease) or
    `process` (one executor process per lease). `allow_code` lets tenants' Python callables
    run on this node; where they cannot run under uids of their own, only with
    `allow_shared_uid` (dangerous: they then run as the worker, with its credentials).
    `chunk_timeout_s` is the deadline of a chunk whose job sets none.
    Outputs over `inline_output_bytes` travel through the tenant's outputs object store.
    A node runs at most `max_executors_per_gpu` executor processes on one GPU and
    `max_executors` in all (worker/executors/pool.py).
    `executor_uids` are the uids tenants' executors run as, one per tenant
    (worker/executors/containment.py); None: root uses the default range, any other user runs
    them as itself.
    """

    node: str = attrs.field(factory=default_node_name, validator=lambda _i, _a, v: token(v, "node"))
    simulate: str | None = None
    slice_bytes: int = attrs.field(default=512 * 2**20, validator=attrs.validators.gt(0))
    heartbeat_s: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))
    # The longest lease lifetime granted or renewed to (operator's cap; longer asks are cut).
    max_ttl_s: float = attrs.field(default=600.0, validator=attrs.validators.gt(0))
    drain_grace_s: float = attrs.field(default=10.0, validator=attrs.validators.ge(0))
    pull_expires_s: float = attrs.field(default=5.0, validator=attrs.validators.ge(1.0))
    max_inflight: int = attrs.field(default=1024, validator=attrs.validators.gt(0))
    isolation: str = attrs.field(default="thread", validator=attrs.validators.in_(ISOLATIONS))
    allow_code: bool = False
    # DANGEROUS: run tenants' code as this worker's own uid when they cannot get uids of their
    # own (worker/executors/containment.py); without it such a worker refuses tenants' code.
    allow_shared_uid: bool = False
    chunk_timeout_s: float = attrs.field(default=3600.0, validator=attrs.validators.gt(0))
    # An executor no lease needs is stopped after this long idle; None: by the GPU's kind
    # (worker/executors/pool.py: 30 s on a real GPU, 600 s on a simulated one).
    executor_idle_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(0))
    )
    inline_output_bytes: int = attrs.field(
        default=256 * 2**10, validator=[attrs.validators.gt(0), attrs.validators.le(512 * 2**10)]
    )
    kernel_modules: tuple[str, ...] = ()
    # The tenants file (quotas, weights, who may run code); None: no limits, weight 1 each.
    tenants_file: str | None = None
    # A tenant this node could not serve in full counts as waiting for this long.
    waiting_ttl_s: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))
    # Under contention, a tenant above its share by less than a slice keeps a slice this long
    # before its turn passes to a waiting tenant (worker/leases/fairness.py).
    turn_s: float = attrs.field(default=30.0, validator=attrs.validators.ge(0))
    # A `fabric.gpu()` block's lease whose slot ran no call for this long is taken back (its
    # next call leases again); 0 never takes one back.
    gpu_idle_s: float = attrs.field(default=GPU_IDLE_S, validator=attrs.validators.ge(0))
    # Recent service, which orders waiting tenants, halves in this time (worker/leases/served.py).
    service_halflife_s: float = attrs.field(default=60.0, validator=attrs.validators.gt(0))
    # Lease requests of one tenant queued or in service on a node; more are refused as busy.
    lease_queue: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    metrics_port: int | None = None
    # Loopback unless told otherwise (a container's scraper needs 0.0.0.0).
    metrics_addr: str = "127.0.0.1"
    executor_uids: UidRange | None = None
    # Caps on executor processes: a Python function's lease gets a lane (process) of its own
    # up to one less than the per-GPU cap; crash suspects are narrowed within the caps.
    max_executors_per_gpu: int = attrs.field(default=8, validator=attrs.validators.ge(2))
    max_executors: int = attrs.field(default=32, validator=attrs.validators.ge(2))
    # Start executors ahead of chunks: a spare per GPU while idle, and a lease's when it is
    # granted (worker/executors/pool.py). Nodes simulated side by side in one process
    # (worker/colocated.py) start one only when a chunk needs it.
    eager_executors: bool = True
    # Executor processes starting at once: each takes about 0.3 s of CPU to import, so more
    # starts than cores only make the first one ready later (64 at once on 2 cores: 8 s).
    executor_starts: int = attrs.field(
        factory=lambda: cpu_count(), validator=attrs.validators.ge(1)
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WorkerSettings:
        """Build settings from `VRAMFABRIC_*` variables; absent ones keep their defaults."""
        kwargs: dict[str, object] = {
            field: environ[name] for name, field in _TEXT_SETTINGS if environ.get(name)
        }
        if environ.get("VRAMFABRIC_SLICE"):
            kwargs["slice_bytes"] = env_size(environ, "VRAMFABRIC_SLICE", 0)
        if environ.get("VRAMFABRIC_ALLOW_CODE"):
            kwargs["allow_code"] = _flag(environ, "VRAMFABRIC_ALLOW_CODE")
        if environ.get("VRAMFABRIC_ALLOW_SHARED_UID"):
            kwargs["allow_shared_uid"] = _flag(environ, "VRAMFABRIC_ALLOW_SHARED_UID")
        if environ.get("VRAMFABRIC_EXECUTOR_UIDS"):
            kwargs["executor_uids"] = _uids(environ, "VRAMFABRIC_EXECUTOR_UIDS")
        if environ.get("VRAMFABRIC_EXECUTOR_IDLE_S"):
            kwargs["executor_idle_s"] = env_float(environ, "VRAMFABRIC_EXECUTOR_IDLE_S", 0.0)
        if environ.get("VRAMFABRIC_METRICS_PORT"):
            kwargs["metrics_port"] = env_int(environ, "VRAMFABRIC_METRICS_PORT", 0)
        return cls(
            heartbeat_s=env_float(environ, "VRAMFABRIC_HEARTBEAT_S", 1.0),
            max_ttl_s=env_float(environ, "VRAMFABRIC_MAX_TTL_S", 600.0),
            drain_grace_s=env_float(environ, "VRAMFABRIC_DRAIN_GRACE_S", 10.0),
            chunk_timeout_s=env_float(environ, "VRAMFABRIC_CHUNK_TIMEOUT_S", 3600.0),
            waiting_ttl_s=env_float(environ, "VRAMFABRIC_WAITING_TTL_S", 10.0),
            turn_s=env_float(environ, "VRAMFABRIC_TURN_S", 30.0),
            gpu_idle_s=env_float(environ, "VRAMFABRIC_GPU_IDLE_S", GPU_IDLE_S),
            service_halflife_s=env_float(environ, "VRAMFABRIC_SERVICE_HALFLIFE_S", 60.0),
            lease_queue=env_int(environ, "VRAMFABRIC_LEASE_QUEUE", 64),
            max_executors_per_gpu=env_int(environ, "VRAMFABRIC_MAX_EXECUTORS_PER_GPU", 8),
            max_executors=env_int(environ, "VRAMFABRIC_MAX_EXECUTORS", 32),
            executor_starts=env_int(environ, "VRAMFABRIC_EXECUTOR_STARTS", cpu_count()),
            **kwargs,  # type: ignore[arg-type]
        )


# Variables read as they are: (name, WorkerSettings field).
_TEXT_SETTINGS = (
    ("VRAMFABRIC_NODE", "node"),
    ("VRAMFABRIC_SIMULATE", "simulate"),
    ("VRAMFABRIC_METRICS_ADDR", "metrics_addr"),
    ("VRAMFABRIC_ISOLATION", "isolation"),
    ("VRAMFABRIC_TENANTS", "tenants_file"),
)


def cpu_count() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _flag(environ: Mapping[str, str], name: str) -> bool:
    """Read a yes/no variable that is set (1/0, true/false, yes/no), naming it in the error."""
    return env_flag(environ, name, False)


def _uids(environ: Mapping[str, str], name: str) -> UidRange:
    """Read a uid range such as `20000-20999`, naming the variable in the error."""
    try:
        return UidRange.parse(environ[name])
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
