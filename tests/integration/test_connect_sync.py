"""vramfabric.connect(): sync and async forms from a thread, Ctrl-C of a call, clean close."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import vramfabric
from tests.helpers import eventually
from tests.integration.conftest import AgentFactory
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import CoordinatorSettings

SETTINGS = CoordinatorSettings(slice_bytes=2**30, lease_ttl_s=3.0, ack_wait_s=1.0)


def cube(x: int) -> int:
    return x**3


def use_it_sync(broker: BrokerSettings) -> tuple[int, list[int], str]:
    """What a script or a notebook cell does, with no event loop of its own."""
    with vramfabric.connect(broker, SETTINGS) as fabric:
        with fabric.gpu(vram="1GiB") as gpu:
            value = gpu.run(cube, 3)
            node = gpu.node
        mapped = sorted(fabric.map(cube, range(5)))
    return value, mapped, node


async def test_the_sync_forms_work_from_a_thread_beside_a_running_loop(
    agent_factory: AgentFactory, broker: BrokerSettings
) -> None:
    # Given a node (served by this test's running event loop)
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    # When sync code uses the fabric (in a thread: its calls block until they are answered)
    value, mapped, node = await asyncio.to_thread(use_it_sync, broker)
    # Then it got its answers, and nothing is leased any more
    assert (value, mapped, node) == (27, [0, 1, 8, 27, 64], "n1")
    await eventually(lambda: agent.ledger.leased_bytes == 0)


async def test_the_async_forms_await_the_core_from_another_loop(
    agent_factory: AgentFactory, broker: BrokerSettings
) -> None:
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await asyncio.to_thread(vramfabric.connect, broker, SETTINGS)
    try:
        async with fabric.gpu() as gpu:
            assert await gpu.run_async(cube, 2) == 8
            assert agent.ledger.leased_bytes == 2**30
        assert [x async for x in fabric.map(cube, [1, 2, 3], ordered=True)] == [1, 8, 27]
    finally:
        await fabric.close_async()
    await eventually(lambda: agent.ledger.leased_bytes == 0)


SCRIPT = """
import sys, time
import vramfabric
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import CoordinatorSettings

def nap(seconds):
    time.sleep(seconds)  # stands in for a long computation on the slice

broker = BrokerSettings(url=sys.argv[1], prefix=sys.argv[2], node_ttl_s=2.0)
fabric = vramfabric.connect(broker, CoordinatorSettings(slice_bytes=2**30, lease_ttl_s=30.0))
with fabric.gpu() as gpu:
    print("calling", flush=True)
    gpu.run(nap, 60)
"""


async def test_ctrl_c_in_a_call_releases_the_slice_within_a_heartbeat(
    agent_factory: AgentFactory, broker: BrokerSettings, tmp_path: object
) -> None:
    # Given a script whose call sleeps a minute on a node (the lease's TTL is 30 s)
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), broker.url, broker.prefix],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert (await asyncio.to_thread(proc.stdout.readline)).strip() == "calling"
        await eventually(
            lambda: any(agent.ledger.is_busy(x.lease_id) for x in agent.ledger.holding())
        )
        # When the user presses Ctrl-C
        os.kill(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        # Then the node has the slice back within one heartbeat (the call's executor stopped)
        await eventually(lambda: agent.ledger.leased_bytes == 0, timeout_s=5)
        assert time.monotonic() - t0 < agent.settings.heartbeat_s * 5
        # And the script ends with KeyboardInterrupt, after its clean-up
        _, err = await asyncio.to_thread(proc.communicate, timeout=20)
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_closed_fabric_says_so() -> None:
    from vramfabric.sync import LoopThread

    loop = LoopThread()
    loop.stop()

    async def nothing() -> None:
        return None

    with pytest.raises(RuntimeError, match="closed"):
        loop.call(nothing())
