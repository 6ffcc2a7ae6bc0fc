"""JobRun: one run of one job on a lease set, from following its results to finishing it.

Fabric.run prepares a job (spec, uploaded work) and drives one JobRun on a lease set of its
own: `start` follows the job's results and dead letters and finds what an earlier run
finished (reopening failures for `retry_failed`) and left queued, and `complete` submits the
chunks still to do through a bounded window while results are folded (leasing slices just
before the first chunk goes out, growing the set while it runs: growth.py). teardown.py
takes everything down again, whatever ended the run.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import attrs

from vramfabric.broker import topology
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import CapacityExceeded
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.stopping import stop_task
from vramfabric.broker.subjects import MAX_PACK_CHUNKS

from ..aggregate import Aggregator
from ..jobs.job import Job
from ..jobs.publish import publish_spec
from ..jobs.record import RunRecord
from ..jobs.requeue import queued_chunks
from ..jobs.stored import finished_chunks
from ..leases.fleet import FleetView
from ..leases.leasing import LeasePool
from ..leases.placement import refusal
from ..metrics import CoordinatorMetrics
from ..settings import CoordinatorSettings
from .exhausted import ExhaustedWatcher
from .growth import FIRST_LEASES, LeaseGrowth
from .packing import Packer
from .rerun import reopen
from .results import Progress, ResultsConsumer
from .submit import Submission
from .timeline import Point, Timeline
from .together import gather_all
from .window import Window

log = logging.getLogger(__name__)


@attrs.define
class JobRun:
    """The followers, lease pool, record and timeline of one run (teardown.py ends them)."""

    conn: Connection
    broker: BrokerSettings
    settings: CoordinatorSettings
    fleet: FleetView
    metrics: CoordinatorMetrics
    job: Job
    spec: JobSpec
    aggregator: Aggregator
    # The lease set the run's chunks go to (its leases are labelled with the job's id).
    pool: LeasePool
    progress: Progress | None = None
    # Submit again the chunks whose stored result is a failure.
    retry_failed: bool = False
    results: ResultsConsumer = attrs.field(init=False)
    window: Window = attrs.field(init=False)
    exhausted: ExhaustedWatcher = attrs.field(init=False)
    record: RunRecord = attrs.field(init=False)
    timeline: Timeline = attrs.field(init=False)
    # Seconds per phase: acquire_s, submit_s, execute_s, release_s.
    phases: dict[str, float] = attrs.field(factory=dict, init=False)
    # How the run's chunks travel (packs of tiny ones), and so how many leases they can use.
    packer: Packer = attrs.field(init=False)
    growth: LeaseGrowth = attrs.field(init=False)
    # Chunks an earlier run of the job left queued: they run as they are, not published again.
    queued: set[int] = attrs.field(factory=set, init=False)
    # Whether leasing began (a chunk went out, or queued ones needed leases): its execute
    # phase is timed from then.
    submitted: bool = attrs.field(default=False, init=False)
    # Whether this run made (or found) the job's consumer: it deletes it when the run ends.
    consumer_made: bool = attrs.field(default=False, init=False)
    _t_submit: float = attrs.field(default=0.0, init=False)
    # The timeline's samples, once the run ended.
    series: tuple[Point, ...] = attrs.field(default=(), init=False)

    def __attrs_post_init__(self) -> None:
        """Build the run's parts; nothing talks to the server until `start`."""
        self.window = Window(self.settings.submit_window, self.settings.submit_window_bytes)
        self.results = ResultsConsumer(
            conn=self.conn,
            broker=self.broker,
            spec=self.spec,
            aggregator=self.aggregator,
            on_progress=self.progress,
            metrics=self.metrics,
            total=None if self.job.streamed else self.spec.n_chunks,
            on_results=self.window.finished_run,
            stall_s=self.settings.follow_stall_s,
            set_aside_failed=self.retry_failed,
        )
        self.packer = Packer(
            self._chunks_per_message(), self.results.speed, self._pack_limit, self.spec.n_chunks
        )
        self.growth = LeaseGrowth(
            pool=self.pool,
            fleet=self.fleet,
            results=self.results,
            packer=self.packer,
            node_ttl_s=self.broker.node_ttl_s,
            job_id=self.spec.job_id,
        )
        self.exhausted = ExhaustedWatcher(self.conn, self.broker, self.spec)
        self.record = RunRecord(self.conn, self.broker, self.spec)
        self.timeline = Timeline(lambda: len(self.pool), lambda: self.results.n_done)

    async def start(self) -> tuple[set[int], set[int]]:
        """Follow the job's results and dead letters.

        Returns:
            The chunks with a final result, and (`retry_failed`) the failed ones reopened.
        """
        try:
            # At once: four round trips one after another were a tenth of a small job's time;
            # the job's consumer, which its first lease waits for, is made beside them.
            _, _, done, self.queued, _ = await gather_all(
                self.results.start(),
                self.exhausted.start(),
                finished_chunks(self.conn, self.broker, self.spec),
                queued_chunks(self.conn, self.broker, self.spec),
                self._make_consumer(),
            )
            if not self.retry_failed:
                return done, set()
            retried = await self.results.replayed(done)
            packs = self.results.set_aside_packs
            await reopen(self.conn, self.broker, self.spec, retried, packs)
            # A failed chunk's pack is reopened whole: its other chunks run again too.
            retried |= {i for first, last in packs for i in range(first, last + 1)}
            return done - retried, retried
        except BaseException:  # re-raised after the clean-up: the caller records it
            # Nothing was leased or submitted yet: stop following, or the subscriptions
            # would outlive the failed call on the caller's connection. A consumer made stays,
            # as after a crash: nothing was delivered from it, and a rerun takes it up.
            await self.stop_following()
            raise

    async def _make_consumer(self) -> None:
        """Make the job's consumer, unless no live node can run the job (`_lease` says why)."""
        if refusal(self.spec, self.fleet.adverts.values(), self.pool.eligible) is None:
            await topology.ensure_job_consumer(self.conn.js, self.broker, self.spec)
            self.consumer_made = True

    @property
    def n_chunks(self) -> int | None:
        """The job's chunk count (None while a streamed job's inputs are still being read)."""
        return self.results.total

    async def complete(
        self,
        done: set[int],
        retried: set[int],
        slices: int | None,
        min_slices: int,
        timeout_s: float | None,
    ) -> bool:
        """Submit the chunks still to do while results are folded; False on timeout.

        Raises:
            CapacityExceeded: fewer than `min(min_slices, target)` leases could be had.
            FollowerStalled: results stopped arriving and resubscribing did not bring them.
            Exception: what reading or encoding the inputs, or the aggregator, raised.
        """
        left = None if self.job.streamed else self.spec.n_chunks - len(done)
        target = min(slices or self.settings.max_slices, left or self.settings.max_slices)
        submission = Submission(
            conn=self.conn,
            broker=self.broker,
            spec=self.spec,
            job=self.job,
            window=self.window,
            results=self.results,
            done=done,
            retried=retried,
            queued=self.queued,
            limit=self.job.input_limit(self.settings),
            before_first=lambda: self._lease(target, min_slices),
            packer=self.packer,
            leases=lambda: len(self.pool),
            rerun=uuid.uuid4().hex[:8] if retried else "",
        )
        submit = asyncio.ensure_future(self._submit(submission))
        waiting = asyncio.ensure_future(self.results.wait(timeout_s))
        try:
            await asyncio.wait({submit, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if submit.done():
                submit.result()  # raises what stopped the submission
            finished = await waiting
        finally:
            for task in (submit, waiting):
                # Until it has ended: the submission publishes, and a cancel nats-py swallows
                # would leave it waiting for room in a window that no result frees.
                await stop_task(task)
        if finished and self.submitted:
            # From the first chunk submitted to the last result in (overlaps submit_s).
            self.phases["execute_s"] = time.perf_counter() - self._t_submit
        return finished

    async def _submit(self, submission: Submission) -> None:
        """Run the submission; then a streamed job's count and digest are known: store them."""
        n = await submission.run()
        if self._t_submit:
            self.phases["submit_s"] = time.perf_counter() - self._t_submit
        if self.job.streamed:
            final = attrs.evolve(self.spec, n_chunks=n, inputs_digest=submission.digest.hexdigest())
            await publish_spec(self.conn, self.broker, final)
            self.results.set_total(n)
        log.info(
            "chunks submitted job=%s submitted=%d inputs=%d",
            self.spec.job_id,
            submission.n_submitted,
            n,
        )

    def _chunks_per_message(self) -> int:
        """The job's own packing setting, else the fabric's."""
        own = self.job.chunks_per_message
        return self.settings.chunks_per_message if own is None else own

    def _pack_limit(self) -> int:
        """The most chunks every node holding the job's leases takes in a pack (1: no packs)."""
        adverts = self.fleet.adverts
        return min(
            (
                adverts[n].max_pack_chunks if n in adverts and adverts[n].packs else 1
                for n in self.pool.nodes()
            ),
            default=MAX_PACK_CHUNKS,
        )

    async def _lease(self, target: int, min_slices: int) -> None:
        """Make the job's consumer if `start` did not, lease slices and start growing the pool.

        Raises:
            CapacityExceeded: fewer than `min(min_slices, target)` leases could be had.
            KernelNotFound, CodeRefused: no live node runs the job's work (placement.refusal).
        """
        refused = refusal(self.spec, self.fleet.adverts.values(), self.pool.eligible)
        if refused is not None:  # before any chunk or lease: the run fails at once
            raise refused
        if not self.consumer_made:  # the fleet had no node for it when the run started
            await topology.ensure_job_consumer(self.conn.js, self.broker, self.spec)
            self.consumer_made = True
        self.submitted = True
        t = time.perf_counter()
        first = min(target, max(min_slices, FIRST_LEASES))
        await self.pool.acquire(first)
        if len(self.pool) < min(min_slices, target):
            raise CapacityExceeded(wanted=min_slices, got=len(self.pool))
        self.pool.start_renewing()
        self.phases["acquire_s"] = time.perf_counter() - t
        self.timeline.sample()
        self._t_submit = time.perf_counter()
        # Short of the target only because it asked for `first`: the rest now, not once the
        # fleet changes (when it is the fleet that gave fewer, asking again at once is moot).
        self.growth.start(target, rest_now=first < target and len(self.pool) >= first)

    async def stop_following(self) -> None:
        """Stop following the job's results and dead letters."""
        await self.results.stop()
        await self.exhausted.stop()
