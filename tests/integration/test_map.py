"""fabric.map: results as they arrive, in order when asked, and nothing left after a break."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from collections.abc import Callable, Iterator

import pytest

import vramfabric
from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker.errors import ChunkFailed
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import CoordinatorSettings

SYNC_SETTINGS = CoordinatorSettings(slice_bytes=2**30, lease_ttl_s=3.0, ack_wait_s=1.0)


def double(x: int) -> int:
    return 2 * x


def not_three(x: int) -> int:
    if x == 3:
        raise ValueError("three is not allowed")
    return x


async def test_map_yields_every_result_and_in_order_when_asked(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    got = [x async for x in fabric.map(double, range(20), slices=2)]
    assert sorted(got) == [2 * i for i in range(20)]
    ordered = [x async for x in fabric.map(double, (i for i in range(20)), ordered=True)]
    assert ordered == [2 * i for i in range(20)]


async def test_a_failed_item_raises_in_its_place(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    seen = []
    with pytest.raises(ChunkFailed, match=r"(?s)item 3: .*three is not allowed"):
        async for x in fabric.map(not_three, range(6), ordered=True):
            seen.append(x)
    assert seen == [0, 1, 2]
    await eventually(lambda: agent.ledger.leased_bytes == 0)


async def test_breaking_out_of_an_endless_map_releases_every_lease_and_leaves_no_job(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given an endless generator of items
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory(submit_window=64)
    read = itertools.count()

    def endless() -> Iterator[int]:
        yield from read

    # When the caller breaks out after 10 results
    results = fabric.map(double, endless(), slices=2)
    taken = []
    async for x in results:
        taken.append(x)
        if len(taken) == 10:
            break
    await results.aclose()  # type: ignore[attr-defined]
    # Then it got 10, only about a window of items was read, and no lease or job is left
    assert len(taken) == 10
    assert next(read) < 10 + 64 + 1000
    assert len(agent.ledger) == 0
    # (a chunk that was running when its lease went keeps the slot until it ends)
    await eventually(lambda: agent.ledger.leased_bytes == 0)
    s = fabric.broker.subjects
    info = await fabric.conn.js.stream_info(s.work_stream(fabric.settings.tenant))
    assert info.state.messages == 0 and info.state.consumer_count == 0


async def test_a_caller_that_stops_reading_stops_the_submission(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a map over an endless generator with a window of 64 chunks
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory(submit_window=64)
    read = itertools.count()

    def endless() -> Iterator[int]:
        yield from read

    results = fabric.map(double, endless(), slices=2)
    # When the caller takes one result and then reads no more for a while
    assert await results.__anext__() in range(0, 200, 2)
    await asyncio.sleep(1.0)  # the sampling interval: what the map reads meanwhile
    # Then the map read no more than a window past what was taken: results not taken hold
    # their places, so memory stays bounded however slow the caller is
    assert next(read) <= 1 + 64 + 1
    await results.aclose()  # type: ignore[attr-defined]


def first_of_endless_map(fabric: vramfabric.SyncFabric) -> int:
    """A plain `for` over a sync map, left with `break` after one result (no close())."""
    first = -1
    for value in fabric.map(double, itertools.count(), slices=2):
        first = int(value)
        break
    return first


def keep_a_map_and_break(fabric: vramfabric.SyncFabric) -> tuple[int, object]:
    """The same, with the results kept in a variable that outlives the loop."""
    results = fabric.map(double, itertools.count(), slices=2)
    first = -1
    for value in results:
        first = int(value)
        break
    return first, results


@pytest.mark.parametrize("loop", [first_of_endless_map, keep_a_map_and_break])
async def test_a_sync_map_left_by_break_releases_within_a_second_without_close(
    agent_factory: AgentFactory, broker: BrokerSettings, loop: Callable[..., object]
) -> None:
    # Given a node, and a sync fabric (as a script or a notebook has) with the garbage
    # collector off, so that nothing but the loop itself can end the map
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await asyncio.to_thread(vramfabric.connect, broker, SYNC_SETTINGS)
    gc.disable()
    try:
        # When a plain `for` loop over an endless map breaks after its first result
        await asyncio.to_thread(loop, fabric)
        left_at = time.monotonic()
        # Then within a second the node's ledger and its advert show nothing leased by the
        # tenant (the map's leases released, not left to the garbage collector)
        await eventually(
            lambda: (
                agent.ledger.leased_bytes == 0
                and agent.ledger.advert(0).tenants.get("default", 0) == 0
            ),
            timeout_s=5.0,
        )
        assert time.monotonic() - left_at < 1.0
        # And the tenant's next map runs to its end
        again = await asyncio.to_thread(lambda: sorted(fabric.map(double, range(20))))
        assert again == [2 * i for i in range(20)]
    finally:
        gc.enable()
        await asyncio.to_thread(fabric.close)
