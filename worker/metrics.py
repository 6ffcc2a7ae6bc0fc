"""WorkerMetrics: the node's Prometheus metrics, in a registry of its own (no global state)."""

from __future__ import annotations

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@attrs.define
class WorkerMetrics:
    """Counters and gauges a node exports; `value()` reads one back for tests and repr."""

    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    leases_active: Gauge = attrs.field(init=False)
    vram_allocated_bytes: Gauge = attrs.field(init=False)
    submit_total: Counter = attrs.field(init=False)
    submit_errors_total: Counter = attrs.field(init=False)
    chunks_done_total: Counter = attrs.field(init=False)
    chunks_retry_total: Counter = attrs.field(init=False)
    duplicate_results_total: Counter = attrs.field(init=False)
    invalid_messages_total: Counter = attrs.field(init=False)
    lease_requests_total: Counter = attrs.field(init=False)
    lease_denials_total: Counter = attrs.field(init=False)
    leases_revoked_total: Counter = attrs.field(init=False)
    chunk_seconds: Histogram = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        """Create the metrics in this instance's registry."""
        r = self.registry
        self.leases_active = Gauge("gpu_leases_active", "Leases held on this node", registry=r)
        self.vram_allocated_bytes = Gauge(
            "gpu_vram_allocated_bytes", "VRAM held by leases on this node", registry=r
        )
        self.submit_total = Counter("gpu_submit", "Kernel executions started", registry=r)
        self.submit_errors_total = Counter(
            "gpu_submit_errors", "Kernel executions that failed", ["kind"], registry=r
        )
        self.chunks_done_total = Counter("chunks_done", "Chunks finished and acked", registry=r)
        self.chunks_retry_total = Counter("chunks_retry", "Chunks nak'ed for retry", registry=r)
        self.duplicate_results_total = Counter(
            "duplicate_results", "Results rejected because one was already recorded", registry=r
        )
        self.invalid_messages_total = Counter(
            "invalid_messages",
            "Payloads that did not decode or validate",
            ["subject"],
            registry=r,
        )
        self.lease_requests_total = Counter(
            "lease_requests", "Lease requests served", ["op", "outcome"], registry=r
        )
        self.lease_denials_total = Counter(
            "lease_denials",
            "Lease requests denied by a tenant's quota or fair share",
            ["tenant", "reason"],
            registry=r,
        )
        self.leases_revoked_total = Counter(
            "leases_revoked", "Leases ended at renewal for the fair share", ["tenant"], registry=r
        )
        self.chunk_seconds = Histogram(
            "chunk_seconds",
            "Kernel time per chunk",
            registry=r,
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120),
        )

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (0 when it has never been set)."""
        return self.registry.get_sample_value(name, labels) or 0.0
