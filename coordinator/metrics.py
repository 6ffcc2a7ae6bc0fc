"""CoordinatorMetrics: a coordinator's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@attrs.define
class CoordinatorMetrics:
    """Leases held, chunk outcomes and rejected input, as the coordinator sees them."""

    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    leases_active: Gauge = attrs.field(init=False)
    chunks_done_total: Counter = attrs.field(init=False)
    chunks_failed_total: Counter = attrs.field(init=False)
    chunks_retry_total: Counter = attrs.field(init=False)
    duplicate_results_total: Counter = attrs.field(init=False)
    invalid_messages_total: Counter = attrs.field(init=False)
    job_seconds: Histogram = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        """Create the metrics in this instance's registry."""
        r = self.registry
        self.leases_active = Gauge("gpu_leases_active", "Leases this coordinator holds", registry=r)
        self.chunks_done_total = Counter("chunks_done", "Chunks with a final result", registry=r)
        self.chunks_failed_total = Counter(
            "chunks_failed", "Chunks whose final result is a failure", ["kind"], registry=r
        )
        self.chunks_retry_total = Counter(
            "chunks_retry", "Deliveries beyond the first, as final results report them", registry=r
        )
        self.duplicate_results_total = Counter(
            "duplicate_results", "Result deliveries for chunks already folded in", registry=r
        )
        self.invalid_messages_total = Counter(
            "invalid_messages", "Payloads that did not decode or validate", ["subject"], registry=r
        )
        self.job_seconds = Histogram("job_seconds", "Wall time of Fabric.run", registry=r)

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (0 when it has never been set)."""
        return self.registry.get_sample_value(name, labels) or 0.0
