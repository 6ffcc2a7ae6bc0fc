"""WorkerSettings: node identity, slicing, timing and limits, read from the environment once."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping

import attrs

from vramfabric.broker.settings import env_float, env_int, env_size
from vramfabric.broker.subjects import token


def default_node_name() -> str:
    """A node name unique per process: host name plus a short random suffix."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())
    return f"{host[:40] or 'node'}-{uuid.uuid4().hex[:6]}"


@attrs.frozen
class WorkerSettings:
    """How one node agent serves its GPUs.

    `simulate` (e.g. `4x48GiB`) replaces NVML discovery with simulated GPUs run on NumPy.
    """

    node: str = attrs.field(factory=default_node_name, validator=lambda _i, _a, v: token(v, "node"))
    simulate: str | None = None
    slice_bytes: int = attrs.field(default=512 * 2**20, validator=attrs.validators.gt(0))
    heartbeat_s: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))
    max_ttl_s: float = attrs.field(default=3600.0, validator=attrs.validators.gt(0))
    drain_grace_s: float = attrs.field(default=10.0, validator=attrs.validators.ge(0))
    pull_expires_s: float = attrs.field(default=5.0, validator=attrs.validators.ge(1.0))
    max_inflight: int = attrs.field(default=1024, validator=attrs.validators.gt(0))
    metrics_port: int | None = None
    # Loopback unless told otherwise (a container's scraper needs 0.0.0.0).
    metrics_addr: str = "127.0.0.1"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WorkerSettings:
        """Build settings from `VRAMFABRIC_*` variables; absent ones keep their defaults."""
        kwargs: dict[str, object] = {}
        if environ.get("VRAMFABRIC_NODE"):
            kwargs["node"] = environ["VRAMFABRIC_NODE"]
        if environ.get("VRAMFABRIC_SIMULATE"):
            kwargs["simulate"] = environ["VRAMFABRIC_SIMULATE"]
        if environ.get("VRAMFABRIC_SLICE"):
            kwargs["slice_bytes"] = env_size(environ, "VRAMFABRIC_SLICE", 0)
        if environ.get("VRAMFABRIC_METRICS_ADDR"):
            kwargs["metrics_addr"] = environ["VRAMFABRIC_METRICS_ADDR"]
        if environ.get("VRAMFABRIC_METRICS_PORT"):
            kwargs["metrics_port"] = env_int(environ, "VRAMFABRIC_METRICS_PORT", 0)
        return cls(
            heartbeat_s=env_float(environ, "VRAMFABRIC_HEARTBEAT_S", 1.0),
            max_ttl_s=env_float(environ, "VRAMFABRIC_MAX_TTL_S", 3600.0),
            drain_grace_s=env_float(environ, "VRAMFABRIC_DRAIN_GRACE_S", 10.0),
            **kwargs,  # type: ignore[arg-type]
        )
