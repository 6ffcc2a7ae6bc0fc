"""Fabric: the Python API. Lease slices, run a job's chunks on them, aggregate, release.

async with await Fabric.connect() as fabric:
    result = await fabric.run(Job(HYPERPARAM_EVAL, inputs), ArgMin())
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import attrs

from vramfabric.broker import buckets
from vramfabric.broker.connection import Connection, connect
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import token

from ..aggregate import Aggregator
from ..calls.interactive import GpuSession, gpu_session
from ..jobs.job import Job
from ..leases.fleet import FleetView
from ..metrics import CoordinatorMetrics
from ..run.jobresult import JobResult
from ..run.results import Progress
from ..run.runner import Runner
from ..settings import CoordinatorSettings
from .jobhandle import JobHandle
from .mapping import map_results
from .tenancy import ensure_own_tenant

log = logging.getLogger(__name__)

# JobResult moved to run/jobresult.py; importers of it from here keep working.
__all__ = ["Fabric", "JobResult"]


@attrs.define
class Fabric:
    """A coordinator for one tenant over one NATS connection."""

    broker: BrokerSettings
    settings: CoordinatorSettings
    conn: Connection
    fleet: FleetView = attrs.field(init=False)
    _owns_conn: bool = False
    metrics: CoordinatorMetrics = attrs.field(factory=CoordinatorMetrics)
    # What runs, maps and calls go through (runner.py), made at start.
    _runner: Runner = attrs.field(init=False)

    @classmethod
    async def connect(
        cls,
        broker: BrokerSettings | None = None,
        settings: CoordinatorSettings | None = None,
        metrics: CoordinatorMetrics | None = None,
    ) -> Fabric:
        """Connect with settings from the environment unless given; watch the fleet."""
        broker = broker or BrokerSettings.from_env()
        settings = settings or CoordinatorSettings.from_env()
        conn = await connect(broker, name="coordinator")
        fabric = cls(
            broker, settings, conn, owns_conn=True, metrics=metrics or CoordinatorMetrics()
        )
        try:
            await fabric.start()
        except BaseException:  # re-raised: a start refused (or failed) leaves no connection open
            await conn.close()
            raise
        return fabric

    async def start(self) -> None:
        """Create the tenant's streams and buckets and start watching adverts.

        Under the call retry policy: a server restarting meanwhile (an operator adding a
        tenant restarts it) delays the start, it does not fail it.
        """
        self.fleet = FleetView(self.conn, self.broker, self.metrics)
        await self.broker.call_retry.call(self._start_once, what="start the fabric")

    async def _start_once(self) -> None:
        await ensure_own_tenant(self.conn, self.broker, self.settings.tenant)
        kernels = await buckets.kernels_store(self.conn.js, self.broker, self.settings.tenant)
        self._runner = Runner(
            self.conn, self.broker, self.settings, self.fleet, self.metrics, kernels
        )
        await self.fleet.start()

    async def close(self) -> None:
        """Stop watching; close the connection if this Fabric opened it."""
        await self.fleet.stop()
        if self._owns_conn:
            await self.conn.close()

    async def __aenter__(self) -> Fabric:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def gpu(
        self, vram: int | str | None = None, *, wait_s: float | None = None
    ) -> AbstractAsyncContextManager[GpuSession]:
        """Lease one slice of `vram` (bytes or "2GiB") for an `async with` block.

        The slice is renewed while the block runs and released when it ends, however it
        ends; `await gpu.run(fn, *args, **kwargs)` runs a function on it. Waiting for a
        free slice (up to `wait_s`; None: until one is free, or Ctrl-C) shows a line on
        stderr with how many tenants stand ahead. A slice the node takes back (no call for
        its idle time, or the fair share) is leased again by the next call.

        Raises:
            CodeRefused: no live worker runs this Python's functions (on entry).
            SliceTooLarge: no GPU of the fleet is as large as `vram` (on entry, at once).
            CapacityExceeded: no slice was free within `wait_s` (on entry).
        """
        return gpu_session(self._runner, vram, wait_s)

    def map(
        self,
        fn: Callable[[Any], Any],
        items: Iterable[Any],
        *,
        vram: int | str | None = None,
        slices: int | None = None,
        ordered: bool = False,
        timeout_s: float | None = None,
    ) -> AsyncIterator[Any]:
        """`fn(item)` for every item as an async iterator, results as they arrive.

        The items are read lazily (a generator may be endless in practice: memory stays
        bounded by the submission window), on up to `slices` slices of `vram` each.
        `ordered=True` yields in the items' order. Leaving the loop early stops the rest
        and releases every lease; a map leaves no job behind. An item whose call failed
        raises ChunkFailed in its place.
        """
        return map_results(
            self._runner, fn, items, vram=vram, slices=slices, ordered=ordered, timeout_s=timeout_s
        )

    async def run(
        self,
        job: Job,
        aggregator: Aggregator,
        *,
        slices: int | None = None,
        progress: Progress | None = None,
        timeout_s: float | None = None,
        min_slices: int = 0,
        retry_failed: bool = False,
    ) -> JobResult:
        """Run `job` to completion on up to `slices` leases and return its aggregate.

        Chunks that already have results (an earlier run of the same job id) are not
        submitted again; with `retry_failed`, those whose result is a failure are. Failed
        chunks are reported in the result, not raised. The aggregator decodes outputs with
        the job's output dtype unless it was given one.

        Raises:
            CodeRefused: a Python function (or a CUDA kernel to run by its reference), and no
                live worker runs code on this Python.
            CapacityExceeded: fewer than `min(min_slices, chunks to do, slices)` leases could
                be had at the start.
            JobTimeout: not every chunk had a result within `timeout_s`.
            JobCancelled: `vramfabric cancel` (or `rm`) stopped the job while it ran.
            Exception: whatever the aggregator raised on a result, as soon as it did.
        """
        return await self._runner.run(
            job,
            aggregator,
            slices=slices,
            progress=progress,
            timeout_s=timeout_s,
            min_slices=min_slices,
            retry_failed=retry_failed,
        )

    def job(self, job_id: str) -> JobHandle:
        """A stored job of this tenant by id: `status()`, `cancel()` and `result()`.

        `result()` re-attaches to a job another process drives (a detached `vramfabric
        run`), or resumes it here when that process is gone (coordinator/api/jobhandle.py).
        """
        return JobHandle(self._runner, token(job_id, "job_id"))
