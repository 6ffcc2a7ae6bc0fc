"""JobHandle: a stored job by id, from any process: its status, cancel, and its result.

`Fabric.job(ID)` returns one. `result()` re-attaches to the job where it stands:

- while a process drives it (its heartbeat beats, jobs/driver.py), the job's results stream is
  followed and folded here, until every chunk has a result; if that process dies meanwhile
  the job is resumed here;
- once every chunk has a result, they are read back and folded;
- when nothing drives it (its coordinator was killed, or stopped), it is resumed here as
  `vramfabric run` does on a rerun: the job is rebuilt from the job file its origin names,
  finished chunks are read back and only missing ones are submitted.

The aggregator is the job file's (`aggregate = ...`) unless one is given (a copy of it
folds each pass); a job started from Python has no job file, so it needs one given, and
resuming it needs the Job itself (`Fabric.run` with the same Job does that).
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any

import attrs

from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import JobCancelled, JobTimeout
from vramfabric.broker.jobdriver import JobDriver, JobOrigin
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.settings import BrokerSettings

from ..aggregate import Aggregator, bind_dtype
from ..decoding import PICKLE
from ..jobs import joblist, lifecycle
from ..jobs.driver import BEAT_S, read_driver, read_origin
from ..jobs.job import UNKNOWN_CHUNKS
from ..jobs.jobfile import JobFile, load
from ..jobs.record import read_record
from ..run.jobresult import JobResult
from ..run.results import ResultsConsumer

if TYPE_CHECKING:
    from ..run.runner import Runner

# Output dtype of a job's aggregator given without one, by kind of work (a CUDA kernel's
# own dtype is in its job file, or must be given with the aggregator).
_DTYPES = {"python": PICKLE}
_DEFAULT_DTYPE = "float32"


@attrs.frozen
class JobStatus:
    """Where a job stands: its state and progress, who drives it, how it was started."""

    job: str
    # running, orphaned (running, but its driver is gone), submitted (no run started),
    # done, failed, timeout or cancelled.
    state: str
    n_chunks: int
    n_done: int
    driver: JobDriver | None
    origin: JobOrigin | None
    # The aggregate as stored in the run record (JSON), once the job finished.
    value: Any = None

    @property
    def alive(self) -> bool:
        """Whether a process drives the job now (its heartbeat beats)."""
        return self.driver is not None


@attrs.define
class JobHandle:
    """A job of the runner's tenant, by id."""

    runner: Runner
    job_id: str

    @property
    def _where(self) -> tuple[Connection, BrokerSettings, str]:
        r = self.runner
        return r.conn, r.broker, r.tenant

    async def status(self) -> JobStatus:
        """The job's state, chunks done, driver and origin.

        Raises:
            JobNotFound: the tenant has no job of this id.
        """
        conn, broker, tenant = self._where
        spec = await joblist.read_spec(conn, broker, tenant, self.job_id)
        return await self._status(spec)

    async def _status(self, spec: JobSpec) -> JobStatus:
        conn, broker, tenant = self._where
        rec = await read_record(conn.js, broker, tenant, self.job_id)
        driver = await read_driver(conn, broker, tenant, self.job_id)
        state = rec.state if rec else "submitted"
        if state == "running" and driver is None:
            state = "orphaned"
        return JobStatus(
            job=self.job_id,
            state=state,
            n_chunks=spec.n_chunks,
            n_done=await joblist.count_results(conn, broker, tenant, self.job_id),
            driver=driver,
            origin=await read_origin(conn, broker, tenant, self.job_id),
            value=joblist.record_value(rec) if rec else None,
        )

    async def cancel(self) -> bool:
        """Stop the job (as `vramfabric cancel`); False if it had already finished.

        Raises:
            JobNotFound: the tenant has no job of this id.
        """
        conn, broker, tenant = self._where
        return await lifecycle.cancel(conn, broker, tenant, self.job_id)

    async def result(
        self, aggregator: Aggregator | None = None, *, timeout_s: float | None = None
    ) -> JobResult:
        """The job's aggregate, once every chunk has a result: followed, read back or resumed.

        Raises:
            JobNotFound: the tenant has no job of this id.
            JobCancelled: the job was cancelled (before or while this waits).
            JobTimeout: not every chunk had a result within `timeout_s`.
            ValueError: no aggregator (a job started from Python: give one), or a job to
                resume whose job file cannot be read or no longer describes the job.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        conn, broker, tenant = self._where
        while True:
            spec = await joblist.read_spec(conn, broker, tenant, self.job_id)
            status = await self._status(spec)
            if status.state == "cancelled":
                raise JobCancelled(f"job {self.job_id} was cancelled")
            all_in = spec.n_chunks != UNKNOWN_CHUNKS and status.n_done >= spec.n_chunks
            follow = status.alive or all_in
            # The job file is read when it gives the aggregator or rebuilds the job.
            needed = aggregator is None or not follow
            jobfile = _load(status.origin, self.job_id) if status.origin and needed else None
            agg = _aggregator(aggregator, jobfile, spec, self.job_id)
            if follow:
                followed = await self._follow(spec, agg, deadline)
                if followed is not None:
                    return followed
                continue  # its driver went away with chunks to do: look again, resume
            if jobfile is None:
                raise ValueError(
                    f"job {self.job_id} has no coordinator and was started from Python, not "
                    "a job file: run the same Job again with Fabric.run to resume it"
                )
            return await self._resume(spec, jobfile, agg, deadline)

    async def _follow(
        self, spec: JobSpec, aggregator: Aggregator, deadline: float | None
    ) -> JobResult | None:
        """Fold the job's results as they come; None if its driver is gone with chunks left."""
        conn, broker, _ = self._where
        t0 = time.perf_counter()
        total = None if spec.n_chunks == UNKNOWN_CHUNKS else spec.n_chunks
        results = ResultsConsumer(
            conn=conn,
            broker=broker,
            spec=spec,
            aggregator=aggregator,
            metrics=self.runner.metrics,
            total=total,
            stall_s=self.runner.settings.follow_stall_s,
        )
        await results.start()
        try:
            while not await results.wait(_wait_s(deadline)):
                if deadline is not None and time.monotonic() >= deadline:
                    raise JobTimeout(
                        f"job {self.job_id}: {results.n_done}/{results.total or '?'} chunks "
                        "done when the wait ended"
                    )
                if not await self._driven(results):
                    return None
        finally:
            await results.stop()
        return JobResult(
            job_id=self.job_id,
            n_chunks=results.total or results.n_done,
            n_ok=results.n_ok,
            n_failed=results.n_failed,
            value=aggregator.value(),
            failures=tuple(results.failures),
            resumed=0,
            leases_peak=0,
            lease_history=(),
            phases_s={"aggregate_s": results.aggregate_s, "total_s": time.perf_counter() - t0},
        )

    async def _driven(self, results: ResultsConsumer) -> bool:
        """Whether following still leads somewhere: a driver beats, or every result is in.

        Raises:
            JobCancelled: the job was cancelled meanwhile.
        """
        conn, broker, tenant = self._where
        rec = await read_record(conn.js, broker, tenant, self.job_id)
        if rec is not None and rec.state == "cancelled":
            raise JobCancelled(f"job {self.job_id} was cancelled")
        spec = await joblist.read_spec(conn, broker, tenant, self.job_id)
        if results.total is None and spec.n_chunks != UNKNOWN_CHUNKS:
            results.set_total(spec.n_chunks)  # a streamed job's inputs ran out
        if await read_driver(conn, broker, tenant, self.job_id) is not None:
            return True
        # No driver: the results still to come are those already stored.
        stored = await joblist.count_results(conn, broker, tenant, self.job_id)
        return results.total is not None and stored >= results.total

    async def _resume(
        self, spec: JobSpec, jobfile: JobFile, aggregator: Aggregator, deadline: float | None
    ) -> JobResult:
        """Drive the job here, from its job file: what has results is read back."""
        runner = self.runner
        # The spec's ack wait is the settings' of the process that started it: resume
        # with it, or the same job file would make another job id (and another consumer).
        settings = attrs.evolve(runner.settings, ack_wait_s=spec.ack_wait_s)
        job = jobfile.job
        if job.spec(settings) != spec:
            raise ValueError(
                f"job {self.job_id}: its job file no longer describes it (the kernel, inputs, "
                "args or settings changed since it started): run it as a new job"
            )
        left = None if deadline is None else max(0.001, deadline - time.monotonic())
        if settings != runner.settings:
            runner = runner.with_settings(settings)
        return await runner.run(job, aggregator, slices=jobfile.slices, timeout_s=left)


def _wait_s(deadline: float | None) -> float:
    """How long to wait for results before looking at the driver again."""
    if deadline is None:
        return BEAT_S
    return max(0.001, min(BEAT_S, deadline - time.monotonic()))


def _load(origin: JobOrigin, job_id: str) -> JobFile:
    """The job file that started the job (ValueError naming it if it cannot be read)."""
    try:
        return load(origin.jobfile)
    except (ValueError, TypeError, ImportError) as exc:
        raise ValueError(f"job {job_id}: job file {origin.jobfile}: {exc}") from None


def _aggregator(
    given: Aggregator | None, jobfile: JobFile | None, spec: JobSpec, job_id: str
) -> Aggregator:
    """The aggregator to fold the job's results with, its output dtype bound."""
    if given is not None:
        # A copy for each pass: a pass cut short (its driver died) must not leave results
        # folded into the one that resumes the job.
        aggregator = copy.deepcopy(given)
        dtype = jobfile.job.output_dtype if jobfile else _DTYPES.get(spec.kernel_kind)
        bind_dtype(aggregator, dtype or _DEFAULT_DTYPE)
        return aggregator
    if jobfile is None:
        raise ValueError(
            f"job {job_id} was started from Python, not a job file: pass its aggregator, "
            "e.g. result(ArgMin())"
        )
    bind_dtype(jobfile.aggregator, jobfile.job.output_dtype)
    return jobfile.aggregator
