"""JobRun: one run of one job, from following its results to releasing its leases.

Fabric.run prepares a job (spec, uploaded work, reopened failures) and drives one JobRun:
`start` follows the job's results and dead letters, `execute` leases slices and submits the
chunks still to do, and `end` takes everything down again, whatever ended the run.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import attrs

from vramfabric.broker import topology
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import CapacityExceeded, VramfabricError
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.settings import BrokerSettings

from .aggregate import Aggregator
from .exhausted import ExhaustedWatcher
from .fleet import FleetView
from .jobs import Job, finished_chunks, submit_chunks
from .leasing import LeasePool
from .metrics import CoordinatorMetrics
from .record import RunRecord
from .results import Progress, ResultsConsumer
from .settings import CoordinatorSettings
from .timeline import Point, Timeline

log = logging.getLogger(__name__)


@attrs.define
class JobRun:
    """The followers, lease pool, record and timeline of one run, and their teardown."""

    conn: Connection
    broker: BrokerSettings
    settings: CoordinatorSettings
    fleet: FleetView
    metrics: CoordinatorMetrics
    job: Job
    spec: JobSpec
    aggregator: Aggregator
    progress: Progress | None = None
    results: ResultsConsumer = attrs.field(init=False)
    exhausted: ExhaustedWatcher = attrs.field(init=False)
    pool: LeasePool = attrs.field(init=False)
    record: RunRecord = attrs.field(init=False)
    timeline: Timeline = attrs.field(init=False)
    # Seconds per phase: acquire_s, submit_s, execute_s, release_s.
    phases: dict[str, float] = attrs.field(factory=dict, init=False)
    _grower: asyncio.Task[None] | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        """Build the run's parts; nothing talks to the server until `start`."""
        self.results = ResultsConsumer(
            self.conn, self.broker, self.spec, self.aggregator, self.progress, self.metrics
        )
        self.exhausted = ExhaustedWatcher(self.conn, self.broker, self.spec)
        self.pool = LeasePool(
            self.conn,
            self.broker,
            self.settings,
            self.fleet,
            self.spec.job_id,
            self.metrics,
            eligible=self.job.work.runs_on,
        )
        self.record = RunRecord(self.conn, self.broker, self.spec)
        self.timeline = Timeline(lambda: len(self.pool), lambda: self.results.n_done)

    async def start(self) -> set[int]:
        """Follow the job's results and dead letters; return the chunks that have a result."""
        try:
            await self.results.start()
            await self.exhausted.start()
            return await finished_chunks(self.conn, self.broker, self.spec)
        except BaseException:
            # Nothing was leased or submitted yet: stop following, or the subscriptions
            # would outlive the failed call on the caller's connection.
            await self._stop_following()
            raise

    async def execute(
        self, todo: list[int], retried: list[int], slices: int | None, min_slices: int
    ) -> float:
        """Lease slices, keep growing the pool, and submit `todo` (of which `retried` reopened).

        Returns the time submission started.

        Raises:
            CapacityExceeded: fewer than `min(min_slices, target)` leases could be had.
        """
        await topology.ensure_job_consumer(self.conn.js, self.broker, self.spec)
        target = min(slices or self.settings.max_slices, len(todo))
        t = time.perf_counter()
        await self.pool.acquire(target)
        if len(self.pool) < min(min_slices, target):
            raise CapacityExceeded(wanted=min_slices, got=len(self.pool))
        self.pool.start_renewing()
        self.phases["acquire_s"] = time.perf_counter() - t
        t = time.perf_counter()
        self._grower = asyncio.get_running_loop().create_task(self._grow(target))
        again = set(retried)
        first = [i for i in todo if i not in again]
        await submit_chunks(self.conn, self.broker, self.spec, self.job.encoded, first)
        if retried:
            rerun = uuid.uuid4().hex[:8]
            await submit_chunks(self.conn, self.broker, self.spec, self.job.encoded, retried, rerun)
        self.phases["submit_s"] = time.perf_counter() - t
        return t

    async def end(self, outcome: str, value: object, submitted: bool) -> tuple[Point, ...]:
        """Take the run down, whatever ended it; return the timeline's samples.

        Every step runs even if one before it raised (that error is raised at the end): the
        leases go back, the followers stop, and the record says how the run ended. A
        `stopped` run (the coordinator, not the job, is stopping) keeps its consumer and its
        record, like a crash: a rerun resumes it.
        """
        self.pool.closing = True
        try:
            if self._grower is not None:
                self._grower.cancel()
                # A grower that died of an error is reported after the leases are released.
                (died,) = await asyncio.gather(self._grower, return_exceptions=True)
            t = time.perf_counter()
            await self.pool.release()
            self.phases["release_s"] = time.perf_counter() - t
            if self._grower is not None and isinstance(died, Exception):
                raise died
        finally:
            series = await self.timeline.stop()
            await self._stop_following()
            if outcome == "stopped":
                await self.record.stop()
            else:
                if submitted:  # a failed, timed-out or cancelled run deletes its consumer too
                    await self._delete_consumer()
                ok, failed = self.results.n_ok, self.results.n_failed
                await self.record.finish(outcome, ok, failed, value)
        return series

    async def _stop_following(self) -> None:
        await self.results.stop()
        await self.exhausted.stop()

    async def _delete_consumer(self) -> None:
        # Best effort: the job is done either way, and a rerun finds every result.
        try:
            await topology.delete_job_consumer(
                self.conn.js, self.broker, self.spec.tenant, self.spec.job_id
            )
        except VramfabricError as exc:
            log.warning("job consumer not deleted job=%s error=%s", self.spec.job_id, exc)

    async def _grow(self, target: int) -> None:
        """Keep adding leases mid-run as the fleet frees capacity, up to what is left to do."""
        pool = self.pool
        while not pool.closing:
            await self.fleet.wait_changed(timeout_s=self.broker.node_ttl_s)
            if pool.closing:
                return
            pool.prune(set(self.fleet.adverts))
            want = min(target, self.spec.n_chunks - self.results.n_done) - len(pool)
            if want > 0:
                # Also when the fleet looks full: the pool then asks one node, which tells
                # the fleet this tenant waits for its fair share.
                added = await pool.acquire(want)
                if added:
                    log.info(
                        "leases added mid-run job=%s added=%d held=%d",
                        self.spec.job_id,
                        added,
                        len(pool),
                    )
