"""A slice is never leased again while code of an ended lease still runs on it.

When a lease ends while a call runs on it (the caller interrupted, the block released), the
call's executor is stopped, and the VRAM counts as free only once it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker import (
    BrokerSettings,
    Connection,
    ReleaseReply,
    ReleaseRequest,
    decode,
    encode,
)
from vramfabric.coordinator import Job
from vramfabric.coordinator.aggregate import Gather


def pid_then_sleep(path: str) -> str:
    """Write this process's pid to `path`, then sleep a minute (a long computation)."""
    Path(path).write_text(str(os.getpid()))
    time.sleep(60)
    return "woke"


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_an_interrupted_call_stops_its_remote_function_before_the_slice_is_free(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a node that runs code and a block whose call runs a minute-long function
    agent = await agent_factory("n1", simulate="1x1GiB", allow_code=True)
    fabric = await fabric_factory()
    pid_file = tmp_path / "pid"

    async def call() -> str:
        async with fabric.gpu(vram="1GiB") as gpu:
            return await gpu.run(pid_then_sleep, str(pid_file))  # type: ignore[no-any-return]

    caller = asyncio.get_running_loop().create_task(call())
    await eventually(lambda: pid_file.exists() and pid_file.read_text() != "", timeout_s=20)
    pid = int(pid_file.read_text())
    assert alive(pid)
    # When the caller is interrupted (its task cancelled, as Ctrl-C in a notebook does)
    caller.cancel()
    running_when_freed: list[bool] = []

    def freed() -> bool:
        if agent.ledger.leased_bytes:
            return False
        running_when_freed.append(alive(pid))
        return True

    # Then the slice's VRAM counts as free within 3 s, and by then the remote function's
    # process is gone
    await eventually(freed, timeout_s=3, interval_s=0.001)
    assert running_when_freed == [False]
    await eventually(lambda: not alive(pid), timeout_s=3)
    # And the slice can be leased again
    async with fabric.gpu(vram="1GiB") as gpu:
        assert await gpu.run(len, "abc") == 3


async def test_a_chunk_whose_lease_is_released_stops_before_its_vram_is_free(
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
    conn: Connection,
    broker: BrokerSettings,
    tmp_path: Path,
) -> None:
    # Given a node of one slice running a job's minute-long chunk
    agent = await agent_factory("n1", simulate="1x1GiB", allow_code=True)
    fabric = await fabric_factory()
    pid_file = tmp_path / "pid"
    job = asyncio.get_running_loop().create_task(
        fabric.run(Job(pid_then_sleep, [str(pid_file)]), Gather(), timeout_s=120)
    )
    try:
        await eventually(lambda: pid_file.exists() and pid_file.read_text() != "", timeout_s=20)
        pid = int(pid_file.read_text())
        [lease] = agent.ledger.holding()
        # When its lease is released under it (as a reclaim or a dead client's end does)
        reply = await conn.nc.request(
            broker.subjects.lease("default", "n1", "release"),
            encode(ReleaseRequest((lease.lease_id,))),
            timeout=5,
        )
        assert decode(ReleaseReply, reply.data).released == (lease.lease_id,)
        running_when_freed: list[bool] = []

        def freed() -> bool:
            # One slice: no other lease can be granted before the released one's VRAM is free.
            others = [held for held in agent.ledger.holding() if held.lease_id != lease.lease_id]
            if agent.ledger.leased_bytes and not others:
                return False
            running_when_freed.append(alive(pid))
            return True

        # Then its VRAM is free within 3 s, and by then the chunk's process is gone
        await eventually(freed, timeout_s=3, interval_s=0.001)
        assert running_when_freed == [False]
        # And the chunk goes back to be run again (on the next lease), not lost
        await eventually(lambda: pid_file.read_text() not in ("", str(pid)), timeout_s=20)
    finally:
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job
