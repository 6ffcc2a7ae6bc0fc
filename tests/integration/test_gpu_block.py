"""`async with fabric.gpu()`: one slice for the block, calls straight to its node, nothing left."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker.errors import LeaseExpired
from vramfabric.coordinator.remote import RemoteTraceback


def leased_bytes(agent: object) -> int:
    return agent.ledger.leased_bytes  # type: ignore[attr-defined, no-any-return]


def square_plus(x: int, plus: int = 0) -> int:
    return x * x + plus


class Odd(ValueError):
    """A user's own exception type: it comes back as itself."""


def fails(x: int) -> int:
    if x % 2:
        raise Odd(f"{x} is odd")
    return x


def slow(seconds: float) -> str:
    time.sleep(seconds)  # stands in for a long computation on the slice
    return "woke"


async def test_a_block_runs_calls_on_its_slice_and_gives_it_back(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node that runs code and a fabric
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    # When a block leases 1 GiB and runs calls with positional and keyword arguments
    async with fabric.gpu(vram="1GiB") as gpu:
        assert leased_bytes(agent) == 2**30
        assert await gpu.run(square_plus, 7) == 49
        assert await gpu.run(square_plus, 3, plus=1) == 10
        assert await gpu.run(lambda: "a lambda") == "a lambda"
    # Then the slice is back the moment the block ends, and no job was made for it
    assert leased_bytes(agent) == 0
    assert gpu.calls == 3
    with pytest.raises(LeaseExpired):
        await gpu.run(square_plus, 1)


async def test_a_remote_exception_is_raised_as_itself_with_its_remote_traceback(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    with pytest.raises(Odd, match="3 is odd") as caught:
        async with fabric.gpu() as gpu:
            assert await gpu.run(fails, 2) == 2
            await gpu.run(fails, 3)
    cause = caught.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in fails" in cause.text and 'raise Odd(f"{x} is odd")' in cause.text
    # And the exception released the slice on its way out
    assert leased_bytes(agent) == 0


async def test_a_cancelled_call_stops_on_the_node_and_its_slice_comes_back(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a block whose call sleeps for a minute on the node
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()

    async def block() -> None:
        async with fabric.gpu() as gpu:
            await gpu.run(slow, 60)

    task = asyncio.ensure_future(block())
    await eventually(lambda: any(agent.ledger.is_busy(x.lease_id) for x in agent.ledger.holding()))
    # When the caller gives up (what Ctrl-C does to the sync facade's call)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Then the lease is released and the call's executor stopped: the VRAM is back at once
    await eventually(lambda: leased_bytes(agent) == 0, timeout_s=agent.settings.heartbeat_s * 5)


async def test_a_block_waits_for_a_slice_and_says_when_none_came(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    from vramfabric.broker.errors import CapacityExceeded

    await agent_factory("n1", simulate="1x1GiB", allow_code=True)
    fabric = await fabric_factory()
    async with fabric.gpu(vram="1GiB"):
        with pytest.raises(CapacityExceeded):
            async with fabric.gpu(vram="1GiB", wait_s=0.5):
                pass


async def test_no_worker_that_runs_code_is_refused_before_leasing(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    from vramfabric.broker.errors import CodeRefused

    agent = await agent_factory("n1", simulate="1x4GiB")
    fabric = await fabric_factory()
    with pytest.raises(CodeRefused, match="--allow-code"):
        async with fabric.gpu():
            pass
    assert leased_bytes(agent) == 0
