"""Executors are replaced: one that loaded many works (its memory does not grow), one left idle."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from tests.integration.test_slots import executor_children
from vramfabric.coordinator import Gather, Job
from vramfabric.kernels.code import Context
from vramfabric.worker.executors.pool import MAX_WORKS_PER_EXECUTOR


def numbered(k: int) -> Callable[[int], tuple[int, int]]:
    """A function of its own (its own blob and digest) that says which process ran it."""

    def where(x: int) -> tuple[int, int]:
        import os

        return k + x, os.getpid()

    return where


def numpy_loaded(_x: int) -> bool:
    """Whether the process the chunk ran in had imported NumPy."""
    import sys

    return "numpy" in sys.modules


def array_module(_x: int, ctx: Context) -> str:
    """The name of the array module the chunk's context gives it."""
    return ctx.xp.__name__


def pid_of_executor(_x: int) -> int:
    """The process the chunk ran in."""
    return os.getpid()


async def test_an_executor_no_lease_needs_stops_after_the_idle_time(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node whose executors stop after half a second that no lease needs them
    await agent_factory("n1", simulate="1x1GiB", allow_code=True, executor_idle_s=0.5)
    fabric = await fabric_factory()
    await eventually(lambda: bool(fabric.fleet.adverts))
    # When a job's chunk has run, and its lease has ended
    first = (await fabric.run(Job(pid_of_executor, [0]), Gather())).value[0]
    # Then the process it ran in exits, and the next job (other inputs: not the same job,
    # which would resume with its result) runs in a fresh one
    await eventually(lambda: not Path(f"/proc/{first}").exists(), timeout_s=10.0)
    second = (await fabric.run(Job(pid_of_executor, [1]), Gather())).value[0]
    assert second != first


async def test_an_executor_past_its_works_is_replaced_once_idle(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node with one slice, so every job's one chunk runs on the same lane
    await agent_factory("n1", simulate="1x1GiB", allow_code=True)
    fabric = await fabric_factory()
    await eventually(lambda: bool(fabric.fleet.adverts))
    # When it runs one more distinct function than an executor keeps, and then one more
    pids = []
    for k in range(MAX_WORKS_PER_EXECUTOR + 2):
        result = await fabric.run(Job(numbered(k), [0]), Gather())
        (value, pid), *_ = result.value
        assert value == k
        pids.append(pid)
    # Then the first ones share one process, and the last runs in a fresh one
    assert len(set(pids[: MAX_WORKS_PER_EXECUTOR + 1])) == 1
    assert pids[-1] != pids[0]


async def test_an_executor_imports_numpy_only_for_work_that_reads_its_context(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a fresh node whose executors run users' functions
    await agent_factory("n1", simulate="1x1GiB", allow_code=True)
    fabric = await fabric_factory()
    await eventually(lambda: bool(fabric.fleet.adverts))
    # When a function that takes no context runs there
    loaded = (await fabric.run(Job(numpy_loaded, [0]), Gather())).value
    # Then its executor had not imported NumPy (nor the CUDA kernels' modules): an
    # executor's start, which a fresh node's first call waits for, took about 0.4 s with them
    assert loaded == [False]
    # And nor had it for an interactive call, whose work reads a context of its own
    async with fabric.gpu() as gpu:
        assert await gpu.run(numpy_loaded, 0) is False
    # And a function that reads its context still gets NumPy as a simulated GPU's array module
    names = (await fabric.run(Job(array_module, [0, 1]), Gather())).value
    assert names == ["numpy", "numpy"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_a_spare_taken_while_it_starts_runs_the_first_chunk_and_no_process_starts_beside_it(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a fresh node of one slice, its spare executor starting (its imports take a while;
    # with no kernel module of the operator's to load, the agent does not wait for it)
    await agent_factory("n1", simulate="1x1GiB", allow_code=True, kernel_modules=())
    fabric = await fabric_factory()
    await eventually(lambda: bool(fabric.fleet.adverts))
    # When a job's one chunk runs at once: its lease takes the spare, started or not
    pid = (await fabric.run(Job(pid_of_executor, [0]), Gather())).value[0]
    # Then the chunk ran in that spare, the node's only executor: a lane whose process was
    # still starting once started a second one, and the chunk waited for that instead
    assert executor_children() == [pid]
