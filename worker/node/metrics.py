"""WorkerMetrics: the node-side Prometheus metrics, in a registry of its own (no global state).

Node-side names (`gpu_*`) count what happens on this node's GPUs; job progress
(`chunks_*`) is counted by the coordinator only, so a `sum()` over all processes counts
every event once.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from vramfabric.broker.messages import Lease

from .flags import DEFAULT_METRICS_PORT

# The port `vramfabric worker --metrics-port` serves on when given no number (compose uses it).
DEFAULT_PORT = DEFAULT_METRICS_PORT
ROLE = "worker"
KERNEL_BUCKETS_S = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120)
LEASE_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1)


@attrs.define
class WorkerMetrics:
    """What a node exports; `value()` reads one sample back (for repr and tests)."""

    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    leases_active: Gauge = attrs.field(init=False)
    vram_allocated_bytes: Gauge = attrs.field(init=False)
    submit_total: Counter = attrs.field(init=False)
    submit_errors_total: Counter = attrs.field(init=False)
    submit_seconds: Histogram = attrs.field(init=False)
    results_duplicate_total: Counter = attrs.field(init=False)
    lease_requests_total: Counter = attrs.field(init=False)
    lease_request_seconds: Histogram = attrs.field(init=False)
    invalid_messages_total: Counter = attrs.field(init=False)
    lease_denials_total: Counter = attrs.field(init=False)
    leases_revoked_total: Counter = attrs.field(init=False)
    _tenants: set[str] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        """Create the metrics in this instance's registry (in this order, as exported)."""
        self._make_holding(self.registry)
        self._make_chunks(self.registry)
        self._make_requests(self.registry)

    def _make_holding(self, r: CollectorRegistry) -> None:
        """What the node's leases hold, per tenant."""
        self.leases_active = Gauge(
            "gpu_leases_active",
            "Leases holding VRAM on this node (live, or released while their chunk finishes)",
            ["tenant"],
            registry=r,
        )
        self.vram_allocated_bytes = Gauge(
            "gpu_vram_allocated_bytes", "VRAM held by leases on this node", ["tenant"], registry=r
        )

    def _make_chunks(self, r: CollectorRegistry) -> None:
        """The chunk deliveries the node ran."""
        self.submit_total = Counter(
            "gpu_submit", "Chunk deliveries this node took to run", ["tenant"], registry=r
        )
        self.submit_errors_total = Counter(
            "gpu_submit_errors",
            "Chunk deliveries that ended in an error (retried elsewhere, or a failed result)",
            ["tenant", "kind"],
            registry=r,
        )
        self.submit_seconds = Histogram(
            "gpu_submit_seconds",
            "Time from taking a chunk to its result being ready",
            ["tenant"],
            registry=r,
            buckets=KERNEL_BUCKETS_S,
        )
        self.results_duplicate_total = Counter(
            "gpu_results_duplicate",
            "Results the results stream already held (an earlier delivery recorded the chunk)",
            ["tenant"],
            registry=r,
        )

    def _make_requests(self, r: CollectorRegistry) -> None:
        """The lease requests the node served, denied or took back, and bad payloads."""
        self.lease_requests_total = Counter(
            "gpu_lease_requests",
            "Lease requests served",
            ["tenant", "op", "outcome"],
            registry=r,
        )
        self.lease_request_seconds = Histogram(
            "gpu_lease_request_seconds",
            "Time to serve one lease request",
            ["op"],
            registry=r,
            buckets=LEASE_BUCKETS_S,
        )
        self.invalid_messages_total = Counter(
            "invalid_messages",
            "Payloads this process rejected because they did not decode or validate",
            ["role", "subject"],
            registry=r,
        )
        self.lease_denials_total = Counter(
            "gpu_lease_denials",
            "Lease requests denied by a tenant's quota or fair share",
            ["tenant", "reason"],
            registry=r,
        )
        self.leases_revoked_total = Counter(
            "gpu_leases_revoked",
            "Leases ended at renewal for the fair share",
            ["tenant"],
            registry=r,
        )

    def invalid(self, subject: str) -> None:
        """Count one rejected payload received on `subject` (a kind, not a full subject)."""
        self.invalid_messages_total.labels(role=ROLE, subject=subject).inc()

    def set_holding(self, leases: Iterable[Lease]) -> None:
        """Set the lease and VRAM gauges from the leases that hold VRAM now, per tenant."""
        count: Tally[str] = Tally()
        held: Tally[str] = Tally()
        for lease in leases:
            count[lease.tenant] += 1
            held[lease.tenant] += lease.slice_bytes
        # A tenant whose leases are all gone reads 0, not its last value.
        self._tenants.update(count)
        for tenant in self._tenants:
            self.leases_active.labels(tenant=tenant).set(count[tenant])
            self.vram_allocated_bytes.labels(tenant=tenant).set(held[tenant])

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
