"""Ending a JobRun, whatever ended it: its leases back, its followers stopped, its outcome kept.

A `stopped` run (the coordinator, not the job, is stopping) keeps its consumer and its
record, like a crash: a rerun resumes it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from vramfabric.broker import topology
from vramfabric.broker.errors import VramfabricError

from .timeline import Point

if TYPE_CHECKING:
    from .jobrun import JobRun

log = logging.getLogger(__name__)


async def end_run(run: JobRun, outcome: str, value: object) -> tuple[Point, ...]:
    """Take the run down; return its timeline's samples.

    Every step runs even if one before it raised (that error is raised at the end): the
    leases go back, the followers stop, and the record says how the run ended.
    """
    run.pool.closing = True
    died: BaseException | None = None
    try:
        died = await run.growth.stop()
    finally:
        # The leases go back while the followers stop and the record says how the run ended
        # (round trips of their own: a tiny job's teardown was a tenth of it); the timeline's
        # last sample comes after the leases went back, and the consumer goes once no lease
        # is left to pull from it.
        released, wound = await asyncio.gather(
            _release(run), _wind_down(run, outcome, value), return_exceptions=True
        )
        series = await run.timeline.stop()
        if outcome != "stopped" and run.consumer_made:  # a failed or cancelled run's too
            await _delete_consumer(run)
    for error in (died, released, wound):
        if isinstance(error, BaseException):
            raise error
    return series


async def _release(run: JobRun) -> None:
    t = time.perf_counter()
    await run.pool.release()
    run.phases["release_s"] = time.perf_counter() - t


async def _wind_down(run: JobRun, outcome: str, value: object) -> None:
    """Stop the followers and record the outcome (or, stopped, nothing)."""
    await run.stop_following()
    if outcome == "stopped":
        await run.record.stop()
    else:
        await run.record.finish(outcome, run.results.n_ok, run.results.n_failed, value)


async def _delete_consumer(run: JobRun) -> None:
    # Best effort: the job is done either way, and a rerun finds every result.
    try:
        await topology.delete_job_consumer(
            run.conn.js, run.broker, run.spec.tenant, run.spec.job_id
        )
    except VramfabricError as exc:
        log.warning("job consumer not deleted job=%s error=%s", run.spec.job_id, exc)
