"""fabric.map: results as they arrive, in order when asked, and nothing left after a break."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker.errors import ChunkFailed


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
