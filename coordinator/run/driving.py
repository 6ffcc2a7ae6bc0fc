"""Driving a prepared run to its end: heartbeat, record, timeline, completion, teardown.

`Fabric.run` and `fabric.map` prepare a job and start its run (jobrun.py); `drive` then
completes it and ends it, whatever ends it. While it drives, the job's heartbeat beats
(jobs/driver.py): it starts before the record says `running` and stops after the record says
how the run ended, so a listing never sees a running job without a driver unless its
driver is gone.
"""

from __future__ import annotations

import asyncio
from typing import Any

from vramfabric.broker.errors import JobTimeout

from ..jobs.driver import Heartbeat
from .jobrun import JobRun
from .teardown import end_run


async def drive(
    run: JobRun,
    done: set[int],
    retried: set[int],
    slices: int | None,
    min_slices: int,
    timeout_s: float | None,
) -> Any:
    """Complete the run and end it, whatever ends it; return the aggregate.

    The record says `done`, or `failed` if a chunk failed or the run raised; a run stopped
    by Ctrl-C or a cancelled task keeps `running` (without its heartbeat: orphaned).

    Raises:
        JobTimeout: not every chunk had a result within `timeout_s`.
        JobCancelled: `cancel` or `rm` stopped the job while it ran.
        Exception: what stopped the run (see JobRun.complete).
    """
    outcome, value = "failed", None
    beat = Heartbeat(run.conn, run.broker, run.spec.tenant, run.spec.job_id)
    try:
        await beat.start()
        await run.record.start()
        run.timeline.start()
        if not await run.record.wait(run.complete(done, retried, slices, min_slices, timeout_s)):
            outcome = "timeout"
            raise JobTimeout(
                f"job {run.spec.job_id}: {run.results.n_done}/{run.n_chunks or '?'} chunks "
                f"done after {timeout_s}s"
            )
        outcome = "failed" if run.results.n_failed else "done"
        value = run.aggregator.value()
    except (asyncio.CancelledError, KeyboardInterrupt):
        # The coordinator is being stopped, not the job: like a crash, a rerun resumes it.
        # Its consumer stays, so the acks of chunks still running land and nothing that
        # finished is delivered again.
        outcome = "stopped"
        raise
    finally:
        try:
            run.series = await end_run(run, outcome, value)
        finally:
            await beat.stop()
    return value
