"""CoordinatorSettings: tenant, lease sizing and timing, read from the environment once."""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from vramfabric.broker.messages import MAX_LEASE_COUNT
from vramfabric.broker.settings import env_float, env_int, env_size
from vramfabric.broker.subjects import MAX_PACK_CHUNKS, token

PLACEMENTS = ("pack", "spread")
# Finished jobs are kept a week by default: long enough to look at, rerun or resume one.
DEFAULT_JOB_RETENTION_S = 7 * 86_400.0


@attrs.frozen
class CoordinatorSettings:
    """How a coordinator leases slices and runs jobs for one tenant."""

    tenant: str = attrs.field(default="default", validator=lambda _i, _a, v: token(v, "tenant"))
    slice_bytes: int = attrs.field(default=512 * 2**20, validator=attrs.validators.gt(0))
    lease_ttl_s: float = attrs.field(default=30.0, validator=attrs.validators.ge(1.0))
    placement: str = attrs.field(default="spread", validator=attrs.validators.in_(PLACEMENTS))
    max_slices: int = attrs.field(default=1000, validator=attrs.validators.gt(0))
    ack_wait_s: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    max_chunk_bytes: int = attrs.field(default=1_000_000, validator=attrs.validators.gt(0))
    # Leases asked of one node in one request; a grant of this many fits well under 1 MB,
    # and a LeaseRequest may not ask for more than MAX_LEASE_COUNT.
    max_lease_batch: int = attrs.field(
        default=2000, validator=[attrs.validators.gt(0), attrs.validators.le(MAX_LEASE_COUNT)]
    )
    # Where `--metrics-port` serves: loopback unless told otherwise (a container's scraper
    # needs 0.0.0.0).
    metrics_addr: str = "127.0.0.1"

    # Finished jobs older than this are removed after each run and by `vramfabric gc`,
    # which also collects the uploaded work no stored job names (coordinator/jobs/collect.py);
    # 0 keeps jobs until `rm`.
    job_retention_s: float = attrs.field(
        default=DEFAULT_JOB_RETENTION_S, validator=attrs.validators.ge(0)
    )
    # Chunks (and bytes of input) a run keeps submitted but without a result: its inputs are
    # read lazily, so these bound the coordinator's memory and the work stream, not the job.
    submit_window: int = attrs.field(default=10_000, validator=attrs.validators.gt(0))
    submit_window_bytes: int = attrs.field(default=256 * 2**20, validator=attrs.validators.gt(0))
    # A results follower that gets nothing this long while the stream holds results for it
    # resubscribes; after three such tries in a row the run fails with FollowerStalled.
    follow_stall_s: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))
    # Chunks per work message: 0 packs tiny chunks once results show they are tiny (auto),
    # 1 sends one chunk per message, N up to N from the start (coordinator/run/packing.py).
    chunks_per_message: int = attrs.field(
        default=0, validator=[attrs.validators.ge(0), attrs.validators.le(MAX_PACK_CHUNKS)]
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CoordinatorSettings:
        """Build settings from `VRAMFABRIC_*` variables; absent ones keep their defaults."""
        return cls(
            tenant=environ.get("VRAMFABRIC_TENANT") or "default",
            slice_bytes=env_size(environ, "VRAMFABRIC_SLICE_BYTES", 512 * 2**20),
            lease_ttl_s=env_float(environ, "VRAMFABRIC_LEASE_TTL_S", 30.0),
            placement=environ.get("VRAMFABRIC_PLACEMENT") or "spread",
            max_slices=env_int(environ, "VRAMFABRIC_MAX_SLICES", 1000),
            ack_wait_s=env_float(environ, "VRAMFABRIC_ACK_WAIT_S", 30.0),
            metrics_addr=environ.get("VRAMFABRIC_METRICS_ADDR") or "127.0.0.1",
            job_retention_s=env_float(
                environ, "VRAMFABRIC_JOB_RETENTION_S", DEFAULT_JOB_RETENTION_S
            ),
            submit_window=env_int(environ, "VRAMFABRIC_SUBMIT_WINDOW", 10_000),
            submit_window_bytes=env_size(environ, "VRAMFABRIC_SUBMIT_WINDOW_BYTES", 256 * 2**20),
            follow_stall_s=env_float(environ, "VRAMFABRIC_FOLLOW_STALL_S", 10.0),
            chunks_per_message=env_int(environ, "VRAMFABRIC_CHUNKS_PER_MESSAGE", 0),
        )
