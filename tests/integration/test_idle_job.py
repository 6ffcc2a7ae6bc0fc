"""A running job whose chunks are busy costs the server no JetStream API calls."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import nats
from nats.aio.msg import Msg

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from tests.kernels_for_tests import SLEEPY, sleepy_input
from vramfabric.broker import BrokerSettings
from vramfabric.coordinator import Gather, Job

IDLE_S = 5.0


async def test_an_idle_running_job_makes_no_jetstream_api_calls(
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
    broker: BrokerSettings,
    tmp_path: Path,
) -> None:
    # Given a job whose one chunk runs for a while, and a client seeing every API request
    await agent_factory("n1")
    fabric = await fabric_factory()
    job = Job(SLEEPY, [sleepy_input(0)], args={"sleep_s": IDLE_S + 4, "log_dir": str(tmp_path)})
    calls: list[str] = []
    work = broker.subjects.work_stream("default")

    async def seen(msg: Msg) -> None:
        # The node's own pulls for its other leases are not the job's.
        if not msg.subject.startswith(f"$JS.API.CONSUMER.MSG.NEXT.{work}."):
            calls.append(msg.subject)

    watcher = await nats.connect(broker.url)
    try:
        await watcher.subscribe("$JS.API.>", cb=seen)
        run = asyncio.create_task(fabric.run(job, Gather()))
        await eventually(lambda: bool(os.listdir(tmp_path)), timeout_s=20)
        # When the job waits for its chunk
        calls.clear()
        await asyncio.sleep(IDLE_S)  # the idle span under test
        # Then nothing asked the JetStream API anything meanwhile (no polling of the
        # record, no checks of the followers' consumers)
        assert calls == []
        result = await run
        assert result.n_ok == 1
    finally:
        await watcher.close()
