"""Factories for agents and fabrics on the session's server, closed after each test."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.errors import NoRespondersError

from tests.helpers import eventually
from vramfabric.broker import BrokerSettings, RenewRequest, connect, encode
from vramfabric.coordinator import CoordinatorSettings, Fabric
from vramfabric.local import LocalFleet
from vramfabric.worker import Agent, WorkerSettings


async def answers(nc: Client, subject: str) -> bool:
    """Whether a renew request on `subject` reaches a responder (the server may briefly say none).

    An empty renew is a valid request that changes nothing (an empty payload would be logged
    by the node as a bad request).
    """
    try:
        await nc.request(subject, encode(RenewRequest(lease_ids=(), ttl_s=1.0)), timeout=1)
    except NoRespondersError:
        return False
    return True


AgentFactory = Callable[..., Awaitable[Agent]]
FabricFactory = Callable[..., Awaitable[Fabric]]


@pytest_asyncio.fixture
async def agent_factory(broker: BrokerSettings) -> AsyncIterator[AgentFactory]:
    """Start in-process agents (test kernels registered, fast heartbeats); stop them after."""
    agents: list[Agent] = []

    async def make(
        node: str, simulate: str = "2x4GiB", slice_bytes: int = 2**30, **kw: Any
    ) -> Agent:
        # The tests' code is the user's own: it may run as the worker where executors cannot
        # get uids of their own (a root Python in /root); a test of the refusal says False.
        kw.setdefault("allow_shared_uid", True)
        kw.setdefault("kernel_modules", ("tests.kernels_for_tests",))
        settings = WorkerSettings(
            node=node,
            simulate=simulate,
            slice_bytes=slice_bytes,
            heartbeat_s=0.2,
            drain_grace_s=1.0,
            **kw,
        )
        agent = Agent(broker, settings, await connect(broker, name=node))
        await agent.start()
        agents.append(agent)
        await eventually(
            lambda: answers(agent.conn.nc, broker.subjects.lease("default", node, "renew"))
        )
        return agent

    yield make
    for agent in agents:
        if not agent.conn.nc.is_closed:
            await agent.stop(grace_s=0.5)
            await agent.conn.close()


@pytest_asyncio.fixture
async def fabric_factory(broker: BrokerSettings) -> AsyncIterator[FabricFactory]:
    """Connect fabrics with short TTLs and ack waits; close them after."""
    fabrics: list[Fabric] = []

    async def make(**kw: object) -> Fabric:
        defaults: dict[str, object] = {"slice_bytes": 2**30, "lease_ttl_s": 3.0, "ack_wait_s": 1.0}
        defaults.update(kw)
        fabric = await Fabric.connect(broker, CoordinatorSettings(**defaults))  # type: ignore[arg-type]
        fabrics.append(fabric)
        return fabric

    yield make
    for fabric in fabrics:
        await fabric.close()


WorkerProcess = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def worker_process(broker: BrokerSettings) -> Iterator[WorkerProcess]:
    """Start real worker processes (test kernels loaded) on demand; stop them after."""
    fleet = LocalFleet(
        workers=0,
        simulate="1x4GiB",
        slice_size="1GiB",
        prefix=broker.prefix,
        url=broker.url,
        node_ttl_s=broker.node_ttl_s,
        worker_args=("--kernel-module", "tests.kernels_for_tests"),
    )

    def start(node: str, *extra_args: str) -> subprocess.Popen[bytes]:
        proc = fleet.add_worker(node, extra_args)
        assert isinstance(proc, subprocess.Popen)  # spawned: this fleet does not fork
        return proc

    yield start
    for proc in fleet.procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a test may have left it frozen
    fleet.stop()
