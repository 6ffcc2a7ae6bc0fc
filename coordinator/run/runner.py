"""Runner: the steps of a run that `Fabric.run`, `fabric.map` and `fabric.gpu` share.

A Fabric makes one at start and hands it to what serves its API: `run` drives a job to its
aggregate here (`run`), `map` prepares a job, starts its run and drives it in the background
(api/mapping.py), a `gpu` block leases a slice in a lease set of its own (calls/interactive.py),
and a `JobHandle` resumes a stored job with it. They all take the Runner, never the Fabric: the
Fabric is the API, the Runner the steps, so nothing below the API imports it back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import attrs
from nats.js.object_store import ObjectStore

from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import CodeRefused, VramfabricError
from vramfabric.broker.messages import JobSpec, NodeAdvert
from vramfabric.broker.settings import BrokerSettings

from ..aggregate import Aggregator, bind_dtype
from ..jobs.collect import housekeep
from ..jobs.job import Job
from ..jobs.publish import publish_spec
from ..jobs.work import JobWork, upload
from ..leases.fleet import FleetView
from ..leases.leasing import LeasePool
from ..metrics import CoordinatorMetrics
from ..settings import CoordinatorSettings
from .driving import drive
from .jobresult import JobResult
from .jobrun import JobRun
from .results import Progress
from .together import gather_all

log = logging.getLogger(__name__)


def _any_node(_advert: NodeAdvert) -> bool:
    return True


@attrs.define
class Runner:
    """One tenant's connection, settings, fleet and kernels store, and a run's steps on them."""

    conn: Connection
    broker: BrokerSettings
    settings: CoordinatorSettings
    fleet: FleetView
    metrics: CoordinatorMetrics
    # The tenant's kernels object store, where a job's work is uploaded.
    kernels: ObjectStore
    # The digests of work `ship` uploaded (or found there) already.
    _shipped: set[str] = attrs.field(factory=set, init=False)

    @property
    def tenant(self) -> str:
        """The tenant whose jobs this runner runs."""
        return self.settings.tenant

    def with_settings(self, settings: CoordinatorSettings) -> Runner:
        """A runner of the same tenant, connection and fleet, with other settings."""
        return Runner(self.conn, self.broker, settings, self.fleet, self.metrics, self.kernels)

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
        """Run `job` to completion and return its aggregate (as `Fabric.run` says)."""
        t0 = time.perf_counter()
        spec = await self.prepare(job, aggregator)
        pool = self.lease_set(spec.job_id, job.work.runs_on)
        run = self.new_run(job, spec, aggregator, pool, progress, retry_failed)
        done, retried = await run.start()
        value = await self.drive(run, done, retried, slices, min_slices, timeout_s)
        return self._result(run, value, len(done), time.perf_counter() - t0)

    async def prepare(self, job: Job, aggregator: Aggregator) -> JobSpec:
        """The job's spec, stored, with its code checked and uploaded."""
        spec = job.spec(self.settings)
        bind_dtype(aggregator, job.output_dtype)
        self._check_code(job)
        # At once (each a round trip): a worker reads either only once a chunk came.
        await gather_all(upload(self.kernels, job.work), publish_spec(self.conn, self.broker, spec))
        return spec

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
            self.conn, self.broker, settings, self.fleet, name, self.metrics, eligible=eligible
        )

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
            conn=self.conn,
            broker=self.broker,
            settings=pool.settings,
            fleet=self.fleet,
            metrics=self.metrics,
            job=job,
            spec=spec,
            aggregator=aggregator,
            pool=pool,
            progress=progress,
            retry_failed=retry_failed,
        )

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

    async def ship(self, work: JobWork) -> None:
        """Upload `work` to the tenant's kernels store, once for this runner."""
        if work.digest not in self._shipped:
            await upload(self.kernels, work)
            self._shipped.add(work.digest)

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
                self.tenant,
                self.settings.job_retention_s,
                time.time(),
                blobs=False,
            )
        except VramfabricError as exc:
            log.warning("old jobs not swept error=%s", exc)
