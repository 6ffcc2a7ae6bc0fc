"""Interactive blocks on a full fleet: idle ones kicked out and put back, waits one can read."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker.errors import SliceTooLarge
from vramfabric.coordinator import Fabric
from vramfabric.coordinator.calls.interactive import gpu_session


def leased_bytes(agent: object) -> int:
    return agent.ledger.leased_bytes  # type: ignore[attr-defined, no-any-return]


def double(x: int) -> int:
    return 2 * x


async def test_an_idle_blocks_slice_is_taken_back_and_its_next_call_leases_again(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node that takes back a block's slice after 1 s without a call, and a block
    # whose leases renew rarely (it hears of the take-back only when it next calls)
    agent = await agent_factory("n1", simulate="1x2GiB", allow_code=True, gpu_idle_s=1.0)
    fabric = await fabric_factory(lease_ttl_s=60.0)
    lines: list[str] = []
    async with gpu_session(fabric._runner, say=lines.append) as gpu:
        assert await gpu.run(double, 1) == 2
        first = gpu.lease
        assert first is not None
        # When the block makes no call for longer than that
        await eventually(lambda: leased_bytes(agent) == 0, timeout_s=15)
        # Then the slice is back on the node, and the block's next call leases one again
        # and runs there (the call the node refused ran nothing and went again)
        assert await gpu.run(double, 21) == 42
        assert gpu.lease is not None and gpu.lease.lease_id != first.lease_id
        assert leased_bytes(agent) == 2**30
    # And nothing was shown: a free slice came at once
    assert lines == []
    assert leased_bytes(agent) == 0


async def test_a_busy_block_keeps_its_slice(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node that takes back idle slices after 1 s
    agent = await agent_factory("n1", simulate="1x2GiB", allow_code=True, gpu_idle_s=1.0)
    fabric = await fabric_factory(lease_ttl_s=60.0)
    async with fabric.gpu() as gpu:
        first = gpu.lease
        assert first is not None
        # When one call runs for 3 s, longer than the idle time
        await gpu.run(__import__("time").sleep, 3.0)
        # Then the slice was not taken from under it
        assert await gpu.run(double, 2) == 4
        assert gpu.lease is not None and gpu.lease.lease_id == first.lease_id
    assert leased_bytes(agent) == 0


async def test_waiting_blocks_show_how_many_stand_ahead_and_are_served_in_turn(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node with one slice, held by tenant a's block
    await agent_factory("n1", simulate="1x1GiB", allow_code=True)
    holder = await fabric_factory(tenant="a")
    first, second = await fabric_factory(tenant="b"), await fabric_factory(tenant="c")
    b_lines: list[str] = []
    c_lines: list[str] = []
    order: list[str] = []
    release_b = asyncio.Event()

    async def student(fabric: Fabric, name: str, lines: list[str]) -> None:
        async with gpu_session(fabric._runner, say=lines.append) as gpu:
            order.append(name)
            assert await gpu.run(double, 3) == 6
            if name == "b":
                await release_b.wait()

    async with holder.gpu() as held:
        assert await held.run(double, 1) == 2
        # When tenant b waits for a slice, then tenant c
        b = asyncio.create_task(student(first, "b", b_lines))
        await eventually(lambda: any("ahead" in line or "full" in line for line in b_lines))
        c = asyncio.create_task(student(second, "c", c_lines))
        # Then c's line says one tenant stands before it
        await eventually(lambda: any("1 tenant(s) ahead" in line for line in c_lines))
        assert all(
            line.startswith("\rvramfabric: waiting for a slice of 1.0 GiB") for line in c_lines
        )
        assert "Ctrl-C" in c_lines[0]
    # And when a's block ends, b (first in line) gets the slice, and c once b is done
    await eventually(lambda: order == ["b"], timeout_s=20)
    assert not c.done()
    release_b.set()
    await asyncio.wait_for(asyncio.gather(b, c), timeout=30)
    assert order == ["b", "c"]
    # And each waiting line ends saying the slice came, and after how long
    assert "got a slice after" in b_lines[-1] and b_lines[-1].endswith("s\n")
    assert "got a slice after" in c_lines[-1]


async def test_a_slice_larger_than_any_gpu_fails_at_once_naming_the_largest(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a fleet whose largest GPU has 4 GiB
    await agent_factory("n1", simulate="2x4GiB", allow_code=True)
    fabric = await fabric_factory()
    # When a block asks for 64 GiB (with no wait limit: it would wait for ever)
    with pytest.raises(SliceTooLarge) as failed:
        async with asyncio.timeout(20):
            async with fabric.gpu(vram="64GiB"):
                pass
    # Then it fails at once, naming the largest slice the fleet has
    assert "64.0 GiB" in str(failed.value) and "4.0 GiB" in str(failed.value)
    assert "n1" in str(failed.value)
    # And a bad wait is refused as such
    with pytest.raises(ValueError, match="wait_s"):
        async with fabric.gpu(wait_s=-1):
            pass
