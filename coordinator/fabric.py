"""Fabric: the Python API. Lease slices, run a job's chunks on them, aggregate, release.

async with await Fabric.connect() as fabric:
    result = await fabric.run(Job(HYPERPARAM_EVAL, inputs), ArgMin())
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import attrs
from nats.js.object_store import ObjectStore

from vramfabric.broker import buckets
from vramfabric.broker.connection import Connection, connect
from vramfabric.broker.errors import CodeRefused, VramfabricError
from vramfabric.broker.messages import JobSpec, NodeAdvert
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import token

from .aggregate import Aggregator, bind_dtype
from .collect import housekeep
from .driving import drive
from .fleet import FleetView
from .interactive import GpuSession, call_work, gpu_session
from .jobhandle import JobHandle
from .jobresult import JobResult
from .jobrun import JobRun
from .jobs import Job, publish_spec
from .leasing import LeasePool
from .mapping import map_results
from .metrics import CoordinatorMetrics
from .results import Progress
from .settings import CoordinatorSettings
from .tenancy import ensure_own_tenant
from .work import JobWork, upload

log = logging.getLogger(__name__)

# JobResult moved to jobresult.py; importers of it from here keep working.
__all__ = ["Fabric", "JobResult"]


def _any_node(_advert: NodeAdvert) -> bool:
    return True


@attrs.define
class Fabric:
    """A coordinator for one tenant over one NATS connection."""

    broker: BrokerSettings
    settings: CoordinatorSettings
    conn: Connection
    fleet: FleetView = attrs.field(init=False)
    _kernels: ObjectStore = attrs.field(init=False)
    _owns_conn: bool = False
    metrics: CoordinatorMetrics = attrs.field(factory=CoordinatorMetrics)
    # The work of interactive calls, once uploaded to the tenant's kernels store.
    _call_work: JobWork | None = attrs.field(default=None, init=False)

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
        self._kernels = await buckets.kernels_store(self.conn.js, self.broker, self.settings.tenant)
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
        return gpu_session(self, vram, wait_s)

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
            self, fn, items, vram=vram, slices=slices, ordered=ordered, timeout_s=timeout_s
        )

    async def call_work(self) -> JobWork:
        """The work of interactive calls, uploaded to the tenant's kernels store once."""
        if self._call_work is None:
            work = call_work()
            await upload(self._kernels, work)
            self._call_work = work
        return self._call_work

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
        t0 = time.perf_counter()
        spec = await self.prepare(job, aggregator)
        pool = self.lease_set(spec.job_id, job.work.runs_on)
        run = self.new_run(job, spec, aggregator, pool, progress, retry_failed)
        done, retried = await run.start()
        value = await self.drive(run, done, retried, slices, min_slices, timeout_s)
        return self._result(run, value, len(done), time.perf_counter() - t0)

    def new_run(
        self,
        job: Job,
        spec: JobSpec,
        aggregator: Aggregator,
        pool: LeasePool,
        progress: Progress | None = None,
        retry_failed: bool = False,
    ) -> JobRun:
        """A run of the prepared job on `pool` (nothing started yet)."""
        return JobRun(
            self.conn,
            self.broker,
            pool.settings,
            self.fleet,
            self.metrics,
            job,
            spec,
            aggregator,
            pool,
            progress,
            retry_failed,
        )

    def lease_set(
        self,
        name: str,
        eligible: Callable[[NodeAdvert], bool] = _any_node,
        slice_bytes: int | None = None,
    ) -> LeasePool:
        """A lease set of this tenant, its leases labelled `name` on the nodes (none held yet).

        Its leases are of `slice_bytes` each (default: the settings' slice size).
        """
        settings = self.settings
        if slice_bytes is not None:
            settings = attrs.evolve(settings, slice_bytes=slice_bytes)
        return LeasePool(
            self.conn,
            self.broker,
            settings,
            self.fleet,
            name,
            self.metrics,
            eligible=eligible,
        )

    async def prepare(self, job: Job, aggregator: Aggregator) -> JobSpec:
        """The job's spec, stored, with its code checked and uploaded."""
        spec = job.spec(self.settings)
        bind_dtype(aggregator, job.output_dtype)
        self._check_code(job)
        await upload(self._kernels, job.work)
        await publish_spec(self.conn, self.broker, spec)
        return spec

    async def drive(
        self,
        run: JobRun,
        done: set[int],
        retried: set[int],
        slices: int | None,
        min_slices: int,
        timeout_s: float | None,
    ) -> Any:
        """Complete the run and end it, whatever ends it; return the aggregate (driving.py)."""
        try:
            value = await drive(run, done, retried, slices, min_slices, timeout_s)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise  # the coordinator is stopping, not the job: nothing ended, nothing swept
        except BaseException:  # re-raised: a run that ended badly is swept after too
            await self._sweep()
            raise
        await self._sweep()  # after every run that ended, well or not
        return value

    def job(self, job_id: str) -> JobHandle:
        """A stored job of this tenant by id: `status()`, `cancel()` and `result()`.

        `result()` re-attaches to a job another process drives (a detached `vramfabric
        run`), or resumes it here when that process is gone (coordinator/jobhandle.py).
        """
        return JobHandle(self, token(job_id, "job_id"))

    def _result(self, run: JobRun, value: Any, resumed: int, total_s: float) -> JobResult:
        results, phases = run.results, run.phases
        phases["aggregate_s"] = results.aggregate_s
        phases["total_s"] = total_s
        self.metrics.job_seconds.labels(tenant=run.spec.tenant).observe(total_s)
        return JobResult(
            job_id=run.spec.job_id,
            n_chunks=run.n_chunks or results.n_done,
            n_ok=results.n_ok,
            n_failed=results.n_failed,
            value=value,
            failures=tuple(results.failures),
            resumed=resumed,
            leases_peak=run.pool.peak,
            lease_history=tuple(run.pool.history),
            phases_s=phases,
            series=run.series,
        )

    def _check_code(self, job: Job) -> None:
        """Refuse Python code up front when no live worker would run it."""
        if not job.work.python or any(job.work.runs_on(a) for a in self.fleet.adverts.values()):
            return
        what = "Python functions" if job.work.kind == "python" else "CUDA kernels' references"
        raise CodeRefused(
            f"no live worker runs {what} on Python {job.work.python} "
            f"(of {len(self.fleet.adverts)} live: start workers with --allow-code on the "
            "same Python version as this client, or add a GPU worker)"
        )

    async def _sweep(self) -> None:
        """Remove the finished jobs past the retention (best effort, logged); gc does blobs."""
        if not self.settings.job_retention_s:
            return
        try:
            await housekeep(
                self.conn,
                self.broker,
                self.settings.tenant,
                self.settings.job_retention_s,
                time.time(),
                blobs=False,
            )
        except VramfabricError as exc:
            log.warning("old jobs not swept error=%s", exc)
