"""An executor that loaded many works is replaced by a fresh one: its memory does not grow."""

from __future__ import annotations

from collections.abc import Callable

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.coordinator import Gather, Job
from vramfabric.worker.pool import MAX_WORKS_PER_EXECUTOR


def numbered(k: int) -> Callable[[int], tuple[int, int]]:
    """A function of its own (its own blob and digest) that says which process ran it."""

    def where(x: int) -> tuple[int, int]:
        import os

        return k + x, os.getpid()

    return where


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
