"""CoordinatorSettings: tenant, lease sizing and timing, read from the environment once."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

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
    # A pack of more than 1,000 chunks counts as 1,000 (coordinator/run/window.py).
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
        fields = attrs.fields_dict(cls)
        return cls(
            **{
                name: read(environ, variable, fields[name].default)
                for name, (variable, read) in _FROM_ENV.items()
            }
        )


def _env_str(environ: Mapping[str, str], name: str, default: str) -> str:
    """A string variable; absent or empty keeps the default."""
    return environ.get(name) or default


# Each setting read from the environment: its variable and how it is read. The defaults are
# the fields' own (written once, above).
_FROM_ENV: dict[str, tuple[str, Callable[[Mapping[str, str], str, Any], Any]]] = {
    "tenant": ("VRAMFABRIC_TENANT", _env_str),
    "slice_bytes": ("VRAMFABRIC_SLICE_BYTES", env_size),
    "lease_ttl_s": ("VRAMFABRIC_LEASE_TTL_S", env_float),
    "placement": ("VRAMFABRIC_PLACEMENT", _env_str),
    "max_slices": ("VRAMFABRIC_MAX_SLICES", env_int),
    "ack_wait_s": ("VRAMFABRIC_ACK_WAIT_S", env_float),
    "metrics_addr": ("VRAMFABRIC_METRICS_ADDR", _env_str),
    "job_retention_s": ("VRAMFABRIC_JOB_RETENTION_S", env_float),
    "submit_window": ("VRAMFABRIC_SUBMIT_WINDOW", env_int),
    "submit_window_bytes": ("VRAMFABRIC_SUBMIT_WINDOW_BYTES", env_size),
    "follow_stall_s": ("VRAMFABRIC_FOLLOW_STALL_S", env_float),
    "chunks_per_message": ("VRAMFABRIC_CHUNKS_PER_MESSAGE", env_int),
}
