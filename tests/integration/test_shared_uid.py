"""Fail closed: a worker whose executors cannot get uids of their own refuses tenants' code.

On a root worker whose Python others cannot read (a pyenv in /root, as on the project's own
machines) or a worker that is not root with no uid range, executors would run tenants' code
as the worker itself. Without `--allow-shared-uid` such a worker refuses that code.
"""

from __future__ import annotations

import os

import pytest

from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker import ErrorKind
from vramfabric.broker.errors import CodeRefused
from vramfabric.coordinator import Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.worker.executors.containment import obstacle
from vramfabric.worker.node.uids import DEFAULT_UIDS

# Only a worker that would share its uid refuses: on a root worker with a readable install
# each tenant gets a uid of its own and code runs without the allowance.
shared_here = os.geteuid() != 0 or bool(obstacle(DEFAULT_UIDS))
pytestmark = pytest.mark.skipif(
    not shared_here, reason="executors get uids of their own on this machine"
)


def double(x: int) -> int:
    return 2 * x


async def test_a_shared_uid_worker_refuses_code_without_the_allowance(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node that runs code, on a machine where executors would share its uid, started
    # without --allow-shared-uid (as a `vramfabric worker` serving tenants is by default)
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True, allow_shared_uid=False)
    assert agent.executors.containment.code_refusal
    fabric = await fabric_factory()
    # When a job of a Python function runs, then each chunk fails as code_refused (permanent,
    # tried once), saying why and naming the flag
    result = await fabric.run(Job(double, [1, 2]), Gather(), timeout_s=20)
    assert result.n_ok == 0 and len(result.failures) == 2
    for failure in result.failures:
        assert failure.error_kind is ErrorKind.CODE_REFUSED and failure.attempt == 1
        assert "--allow-shared-uid" in (failure.error or "")
        assert "not readable by other users" in (failure.error or "") or os.geteuid() != 0
    # And a `gpu.run` call on a leased slice is refused the same way, the slice given back
    with pytest.raises(CodeRefused, match="--allow-shared-uid"):
        async with fabric.gpu(vram="1GiB") as gpu:
            await gpu.run(double, 3)
    assert agent.ledger.leased_bytes == 0


async def test_a_shared_uid_worker_runs_code_with_the_allowance(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given the same node, started with --allow-shared-uid
    await agent_factory("n1", simulate="1x4GiB", allow_code=True, allow_shared_uid=True)
    fabric = await fabric_factory()
    # When a job of a Python function and a call run, then both run
    result = await fabric.run(Job(double, [1, 2]), Gather(), timeout_s=20)
    assert sorted(result.value) == [2, 4] and not result.failures
    async with fabric.gpu(vram="1GiB") as gpu:
        assert await gpu.run(double, 3) == 6
