"""Chunks that start processes which outlive them: nothing of theirs keeps running or holds a slot.

Each chunk here starts a child that would sleep for ten minutes holding the executor's
descriptors (its stdout, its stderr and, for a fork, its frame pipes), then returns, crashes
its executor or hangs past its deadline. The child must be gone once the chunk's outcome is
in, the lease's slot free for the next job, and a worker stop must not wait for the child.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker import ErrorKind, RetryPolicy
from vramfabric.coordinator import Fabric, Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.worker import Agent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A child that outlives its chunk: (pid, start time in clock ticks), so a reused pid is told apart.
Child = tuple[int, int]
NO_RETRY = RetryPolicy(max_retries=0)


def start_ticks(pid: int) -> int:
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def running(child: Child) -> bool:
    """Whether that process still runs (a zombie has ended: it only waits to be reaped)."""
    pid, ticks = child
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return int(fields[19]) == ticks and fields[0] not in ("Z", "X")


def start_children() -> list[Child]:
    """A `sleep` started with Popen and a forked copy of the executor, both left to sleep 600 s.

    Both hold the executor's stdout and stderr; the fork holds every descriptor it had.
    """
    sleeper = subprocess.Popen(["sleep", "600"])
    pid = os.fork()
    if pid == 0:
        time.sleep(600)  # stands in for a helper process a chunk forgot
        os._exit(0)
    return [(sleeper.pid, start_ticks(sleeper.pid)), (pid, start_ticks(pid))]


def forks_and_returns(_i: int) -> list[Child]:
    """Starts two children, returns while they sleep."""
    return start_children()


def forks_and_crashes(where: str) -> None:
    """Starts two children, writes who they are, then ends its executor."""
    children = start_children()
    Path(where).write_text(json.dumps(children))
    os._exit(1)  # an executor that dies under the chunk


def forks_and_hangs(where: str) -> None:
    """Starts two children, writes who they are, then hangs."""
    children = start_children()
    Path(where).write_text(json.dumps(children))
    time.sleep(600)  # a chunk that never ends


def written_children(paths: list[Path]) -> list[Child]:
    """The children each chunk wrote down."""
    out: list[Child] = []
    for path in paths:
        out.extend((pid, ticks) for pid, ticks in json.loads(path.read_text()))
    return out


def nothing_leased(agent: Agent) -> bool:
    """Whether the node holds no lease and its advert shows no VRAM leased."""
    advert = agent.ledger.advert(time.time())
    return not agent.ledger.holding() and all(g.leased_bytes == 0 for g in advert.gpus)


async def the_slots_run_again(fabric: Fabric, agent: Agent) -> None:
    """A job on all 4 slices of the node runs, and then the node holds nothing."""
    await eventually(lambda: nothing_leased(agent), timeout_s=15)
    again = await fabric.run(
        Job(forks_and_returns, list(range(4)), chunks_per_message=1),
        Gather(),
        slices=4,
        min_slices=4,
        timeout_s=60,
    )
    assert again.n_ok == 4 and again.leases_peak == 4
    assert not any(running(c) for children in again.value for c in children)
    await eventually(lambda: nothing_leased(agent), timeout_s=15)


async def test_children_a_chunk_leaves_running_are_gone_when_its_result_is_in(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node of 4 slices that runs code
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    # When 8 chunks each start two children and return while they sleep
    job = Job(forks_and_returns, list(range(8)), chunks_per_message=1, retry=NO_RETRY)
    result = await fabric.run(job, Gather(), slices=4, timeout_s=60)
    # Then every chunk succeeded, and none of their 16 children runs once the results are in
    assert result.n_ok == 8, result.failures
    children = [c for chunk in result.value for c in chunk]
    assert len(children) == 16
    assert [c for c in children if running(c)] == []
    # And no slot is held: a job on all 4 slices runs, and the node then holds nothing
    await the_slots_run_again(fabric, agent)


async def test_an_executor_that_dies_under_a_forking_chunk_frees_its_slot(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a node of 4 slices, and 8 chunks that each start two children and end their
    # executor (the children hold its frame pipe open: it never reaches end-of-file)
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    paths = [tmp_path / f"children-{i}" for i in range(8)]
    job = Job(forks_and_crashes, [str(p) for p in paths], chunks_per_message=1, retry=NO_RETRY)
    # When the job runs
    result = await asyncio.wait_for(fabric.run(job, Gather(), slices=4, timeout_s=60), 90)
    # Then each chunk failed as a crash, and every child died with its executor
    assert result.n_failed == 8
    assert {f.error_kind for f in result.failures} == {ErrorKind.CRASHED}
    children = written_children(paths)
    assert len(children) == 16
    await eventually(lambda: not any(map(running, children)), timeout_s=10)
    # And no slot is held: a job on all 4 slices runs, and the node then holds nothing
    await the_slots_run_again(fabric, agent)


async def test_a_forking_chunk_past_its_deadline_takes_its_children_with_it(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a node of 4 slices, and 4 chunks with a 1 s deadline that start children and hang
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory(ack_wait_s=5.0)
    paths = [tmp_path / f"children-{i}" for i in range(4)]
    job = Job(
        forks_and_hangs,
        [str(p) for p in paths],
        chunks_per_message=1,
        retry=NO_RETRY,
        timeout_s=1.0,
    )
    # When the job runs
    result = await asyncio.wait_for(fabric.run(job, Gather(), slices=4, timeout_s=60), 90)
    # Then each chunk timed out, and its children were killed with its executor
    assert result.n_failed == 4
    assert {f.error_kind for f in result.failures} == {ErrorKind.TIMEOUT}
    children = written_children(paths)
    await eventually(lambda: not any(map(running, children)), timeout_s=10)
    # And no slot is held
    await the_slots_run_again(fabric, agent)


async def test_a_worker_stop_does_not_wait_for_children_of_a_hung_chunk(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a node whose 2 running chunks started children and hang (no deadline of theirs)
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory(ack_wait_s=5.0)
    paths = [tmp_path / f"children-{i}" for i in range(2)]
    job = Job(forks_and_hangs, [str(p) for p in paths], chunks_per_message=1, retry=NO_RETRY)
    run = asyncio.ensure_future(fabric.run(job, Gather(), slices=2))
    try:
        await eventually(lambda: all(p.exists() and p.read_text() for p in paths), timeout_s=60)
        children = written_children(paths)
        # When the worker stops with a grace period of 1 s
        grace_s = 1.0
        t0 = time.monotonic()
        await asyncio.wait_for(agent.stop(grace_s=grace_s), 60)
        stopped_in_s = time.monotonic() - t0
        await agent.conn.close()
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
    # Then it stopped within its grace period (and a margin for a loaded machine), and the
    # children of its chunks are gone
    assert stopped_in_s < grace_s + 5.0, stopped_in_s
    await eventually(lambda: not any(map(running, children)), timeout_s=10)
