"""CoordinatorMetrics: the job-side Prometheus metrics, in a registry of its own.

Job-side names (`chunks_*`, `job_*`) count job progress as the coordinator sees it; what
happens on GPUs (`gpu_*`, leases included) is counted by the nodes only, so a `sum()` over
all processes counts every event once.
"""

from __future__ import annotations

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# The port `vramfabric run/demo --metrics-port` serves on when given no number (compose uses it).
DEFAULT_PORT = 9101
ROLE = "coordinator"
LEASE_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
JOB_BUCKETS_S = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


@attrs.define
class CoordinatorMetrics:
    """Job progress, the leases jobs hold and rejected input, as one coordinator sees them."""

    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    leases_held: Gauge = attrs.field(init=False)
    chunks_done_total: Counter = attrs.field(init=False)
    chunks_failed_total: Counter = attrs.field(init=False)
    chunks_retry_total: Counter = attrs.field(init=False)
    chunks_duplicate_total: Counter = attrs.field(init=False)
    lease_acquire_seconds: Histogram = attrs.field(init=False)
    job_seconds: Histogram = attrs.field(init=False)
    invalid_messages_total: Counter = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        """Create the metrics in this instance's registry."""
        r = self.registry
        self.leases_held = Gauge(
            "job_leases_held",
            "Leases this coordinator's jobs hold (nodes count them as gpu_leases_active)",
            ["tenant"],
            registry=r,
        )
        self.chunks_done_total = Counter(
            "chunks_done", "Chunks with a final result, ok or failed", ["tenant"], registry=r
        )
        self.chunks_failed_total = Counter(
            "chunks_failed",
            "Chunks whose final result is a failure",
            ["tenant", "kind"],
            registry=r,
        )
        self.chunks_retry_total = Counter(
            "chunks_retry",
            "Deliveries beyond the first, as final results report them",
            ["tenant"],
            registry=r,
        )
        self.chunks_duplicate_total = Counter(
            "chunks_duplicate",
            "Result deliveries for chunks already folded in",
            ["tenant"],
            registry=r,
        )
        self.lease_acquire_seconds = Histogram(
            "job_lease_acquire_seconds",
            "Round trip of one lease request to one node",
            ["tenant"],
            registry=r,
            buckets=LEASE_BUCKETS_S,
        )
        self.job_seconds = Histogram(
            "job_seconds", "Wall time of Fabric.run", ["tenant"], registry=r, buckets=JOB_BUCKETS_S
        )
        self.invalid_messages_total = Counter(
            "invalid_messages",
            "Payloads this process rejected because they did not decode or validate",
            ["role", "subject"],
            registry=r,
        )

    def invalid(self, subject: str) -> None:
        """Count one rejected payload received on `subject` (a kind, not a full subject)."""
        self.invalid_messages_total.labels(role=ROLE, subject=subject).inc()

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve `/metrics` over HTTP on a daemon thread; return the port (0 picks a free one)."""
        httpd, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(httpd.server_address[1])

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 when none)."""
        return sum(
            sample.value
            for metric in self.registry.collect()
            for sample in metric.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )
