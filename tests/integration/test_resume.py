"""A coordinator stopped mid-job and rerun with the same job id resumes, recomputing nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from tests.kernels_for_tests import SLEEPY, executions, sleepy_input
from vramfabric.coordinator import ArgMin, Job, Mean
from vramfabric.coordinator.jobs.stored import finished_chunks

N_CHUNKS = 40
N_LEASES = 4


async def test_stopped_coordinator_rerun_completes_without_recomputing_finished_chunks(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a job of 40 slow-ish chunks running on 4 leases
    await agent_factory("n1", simulate="1x4GiB")
    job = Job(
        SLEEPY,
        [sleepy_input(i) for i in range(N_CHUNKS)],
        args={"sleep_s": 0.03, "log_dir": str(tmp_path)},
    )
    first = await fabric_factory()
    run = asyncio.create_task(first.run(job, Mean(), slices=N_LEASES, timeout_s=60))
    # When the coordinator is stopped once about a quarter of the chunks have run
    await eventually(lambda: sum(executions(str(tmp_path)).values()) >= N_CHUNKS // 4, timeout_s=20)
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    await first.close()
    # And a new coordinator runs the same job (same spec, so the same job id)
    second = await fabric_factory()
    finished = await finished_chunks(second.conn, second.broker, job.spec(second.settings))
    assert finished, "some chunks had results before the stop"
    result = await second.run(job, Mean(), slices=N_LEASES, timeout_s=60)
    # Then every chunk has exactly one result and the mean is over all of them
    assert result.n_ok == N_CHUNKS
    assert result.value == sum(range(N_CHUNKS)) / N_CHUNKS
    assert result.resumed >= N_CHUNKS // 4 - N_LEASES
    # And only chunks that were in flight at the stop ran twice (at most one per lease)
    counts = executions(str(tmp_path))
    assert set(counts) == set(range(N_CHUNKS))
    twice = {i for i, n in counts.items() if n > 1}
    assert len(twice) <= N_LEASES
    assert all(counts[i] <= 2 for i in counts)
    # And chunks whose results were in before the rerun never ran again
    assert result.resumed >= len(finished)
    assert all(counts[i] == 1 for i in finished)


async def test_rerun_of_a_finished_job_submits_nothing(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a finished job
    agent = await agent_factory("n1")
    fabric = await fabric_factory()
    job = Job(SLEEPY, [sleepy_input(i) for i in range(5)], args={"log_dir": str(tmp_path)})
    done = await fabric.run(job, ArgMin(), timeout_s=30)
    # When it is run again
    again = await fabric.run(job, ArgMin(), timeout_s=30)
    # Then the answer is read back from the results stream, and nothing runs or is leased
    assert again.job_id == done.job_id and again.value == done.value == (0, 0.0)
    assert again.resumed == 5 and again.leases_peak == 0
    assert sum(executions(str(tmp_path)).values()) == 5
    assert agent.metrics.value("gpu_submit_total") == 5


async def test_rerun_packing_otherwise_runs_the_chunks_left_queued_once(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a job of 40 chunks queued in packs of 8 on one lease, its coordinator stopped
    # after 16 chunks ran (as a killed one: the chunks not run stay queued)
    await agent_factory("n1", simulate="2x4GiB")
    inputs = [sleepy_input(i) for i in range(N_CHUNKS)]
    args = {"sleep_s": 0.05, "log_dir": str(tmp_path)}
    packed = Job(SLEEPY, inputs, args=args, job_id="queued-packs", chunks_per_message=8)
    first = await fabric_factory()
    run = asyncio.create_task(first.run(packed, Mean(), slices=1, timeout_s=60))
    await eventually(lambda: sum(executions(str(tmp_path)).values()) >= 16, timeout_s=20)
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    await first.close()
    last = max(executions(str(tmp_path)))
    in_flight = set(range(last - last % 8, last - last % 8 + 8))  # the pack it ran in
    # When a new coordinator reruns the job on 8 leases, sending one chunk a message (other
    # message ids), so that leases beyond the queued packs are free to run any it sent
    single = attrs.evolve(packed, chunks_per_message=1)
    second = await fabric_factory()
    result = await second.run(single, Mean(), slices=8, timeout_s=60)
    # Then the answer is whole, and only the pack running at the stop ran twice: the packs
    # left queued ran from the queue, once each, not again under the rerun's message ids
    assert result.n_ok == N_CHUNKS
    assert result.value == sum(range(N_CHUNKS)) / N_CHUNKS
    counts = executions(str(tmp_path))
    assert set(counts) == set(range(N_CHUNKS))
    again = {i for i, n in counts.items() if n > 1} - in_flight
    assert not again, f"chunks not running at the stop ran again: {sorted(again)}"
    assert all(counts[i] <= 2 for i in in_flight)
