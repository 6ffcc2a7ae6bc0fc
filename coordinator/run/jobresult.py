"""JobResult: what a finished job returns (the aggregate, counts, failures, timings)."""

from __future__ import annotations

from typing import Any

import attrs

from vramfabric.broker.errors import JobFailed
from vramfabric.broker.messages import ChunkResult

from .timeline import Point


@attrs.frozen
class JobResult:
    """What a finished job returns: the aggregate, counts, failures and phase timings."""

    job_id: str
    n_chunks: int
    n_ok: int
    n_failed: int
    value: Any
    failures: tuple[ChunkResult, ...]
    resumed: int
    leases_peak: int
    lease_history: tuple[tuple[float, int], ...]
    phases_s: dict[str, float]
    # (seconds since the start, leases held, chunks done), sampled through the run.
    series: tuple[Point, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether every chunk succeeded."""
        return self.n_failed == 0

    def raise_for_failures(self) -> JobResult:
        """Return self if every chunk succeeded, else raise JobFailed with the failures."""
        if self.n_failed:
            raise JobFailed(self.job_id, self.n_failed, self.failures)
        return self
