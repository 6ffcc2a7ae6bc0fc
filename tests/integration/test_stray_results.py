"""Stray messages on a job's result subjects (issue 13): counted and dropped, the job runs on."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from tests.kernels_for_tests import SLEEPY, executions, sleepy_input
from vramfabric.broker.connection import Connection
from vramfabric.coordinator import Fabric, Job, Mean
from vramfabric.coordinator.jobs.joblist import inspect

N_CHUNKS = 12
# What `Subjects.result` never builds, each below the job's results: a non-numeric tail, a
# sign, a leading zero (it would shadow chunk 7), an index past the job's end, one past int64.
BEFORE = ("x", "-1", "007")
DURING = (str(N_CHUNKS), "9" * 30, "x.y")


async def publish_strays(fabric: Fabric, job: Job, tails: tuple[str, ...]) -> None:
    """Publish junk as the tenant, straight into the results stream, below the job's subjects."""
    s, spec = fabric.broker.subjects, job.spec(fabric.settings)
    below = s.result_filter(spec.tenant, spec.job_id)[: -len(">")]
    conn: Connection = fabric.conn
    for tail in tails:
        ack = await conn.js.publish(below + tail, b"not a result")
        assert ack.stream == s.results_stream(spec.tenant)


async def started(run: asyncio.Task[object], log_dir: Path, n: int) -> None:
    """Wait until `n` chunks have run; raise at once what ended the run if it ended first."""
    await eventually(lambda: run.done() or sum(executions(str(log_dir)).values()) >= n, 20)
    if run.done():
        run.result()
        raise AssertionError("the run ended before the strays were published")


async def test_stray_result_messages_leave_the_job_whole_and_resumable(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a job whose result subjects already hold stray messages
    await agent_factory("n1", simulate="1x4GiB")
    fabric = await fabric_factory()
    job = Job(
        SLEEPY,
        [sleepy_input(i) for i in range(N_CHUNKS)],
        args={"sleep_s": 0.1, "log_dir": str(tmp_path)},
    )
    await publish_strays(fabric, job, BEFORE)
    # When it runs, and more strays arrive while it runs
    run = asyncio.create_task(fabric.run(job, Mean(), slices=2, timeout_s=30))
    await started(run, tmp_path, 2)
    await publish_strays(fabric, job, DURING)
    result = await run
    # Then every chunk ran once and the value is right; the strays were counted, not folded
    assert (result.n_ok, result.n_failed) == (N_CHUNKS, 0)
    assert result.value == sum(range(N_CHUNKS)) / N_CHUNKS
    assert fabric.metrics.value("invalid_messages_total", subject="result") == len(BEFORE + DURING)
    # And a rerun (resume) reads the stored results back past the strays
    again = await fabric.run(job, Mean(), timeout_s=30)
    assert again.resumed == N_CHUNKS and again.value == result.value
    # And so does a rerun of failed chunks (there are none), and the job's status
    retried = await fabric.run(job, Mean(), timeout_s=30, retry_failed=True)
    assert retried.value == result.value and retried.n_failed == 0
    spec = job.spec(fabric.settings)
    info = await inspect(fabric.conn, fabric.broker, spec.tenant, spec.job_id)
    assert (info.n_ok, info.n_failed, info.state) == (N_CHUNKS, 0, "done")
    assert all(n == 1 for n in executions(str(tmp_path)).values())


async def test_stopped_job_with_strays_resumes(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a job stopped part way, with stray messages on its result subjects
    await agent_factory("n1", simulate="1x4GiB")
    first = await fabric_factory()
    job = Job(
        SLEEPY,
        [sleepy_input(i) for i in range(N_CHUNKS)],
        args={"sleep_s": 0.1, "log_dir": str(tmp_path)},
    )
    await publish_strays(first, job, BEFORE)
    run = asyncio.create_task(first.run(job, Mean(), slices=1, timeout_s=30))
    await started(run, tmp_path, 3)
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    await first.close()
    # When a new coordinator runs the same job
    second = await fabric_factory()
    result = await second.run(job, Mean(), slices=2, timeout_s=30)
    # Then it resumes (chunks with results are not run again) and the value is right
    assert result.n_ok == N_CHUNKS and result.resumed >= 2
    assert result.value == sum(range(N_CHUNKS)) / N_CHUNKS
    assert set(executions(str(tmp_path))) == set(range(N_CHUNKS))
