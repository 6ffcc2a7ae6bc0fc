"""Auth on: a server started with the config generated from a tenants file, and its users."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import attrs
import pytest
import pytest_asyncio

from tests.authsetup import REQUEST_TIMEOUT_S, TENANTS_TOML, AuthFabric
from vramfabric.broker import auth, tenants
from vramfabric.broker.connection import Connection, connect
from vramfabric.broker.server import NatsServer
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import CoordinatorSettings, Fabric
from vramfabric.worker import Agent, WorkerSettings


@pytest.fixture(scope="module")
def auth_fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthFabric]:
    """nats-server on a free port with the config generated from TENANTS_TOML, provisioned."""
    folder = tmp_path_factory.mktemp("auth")
    path = folder / "tenants.toml"
    path.write_text(TENANTS_TOML)
    file = tenants.load(path)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    base = BrokerSettings(prefix=prefix, node_ttl_s=2.0, request_timeout_s=REQUEST_TIMEOUT_S)
    config = auth.write_config(file, base.subjects, folder / "server.json", port=-1)
    server = NatsServer(config_file=str(config), store_dir=str(folder / "js")).start()
    try:
        fabric = AuthFabric(attrs.evolve(base, url=server.url), file, path)
        asyncio.run(auth.provision_tenants(fabric.operator, file))
        yield fabric
    finally:
        server.stop()


@pytest_asyncio.fixture
async def connections(
    auth_fabric: AuthFabric,
) -> AsyncIterator[Callable[[BrokerSettings], Awaitable[Connection]]]:
    """Open connections as any user; all closed after the test."""
    opened: list[Connection] = []

    async def open_as(settings: BrokerSettings) -> Connection:
        conn = await connect(settings, name="test-auth")
        opened.append(conn)
        return conn

    yield open_as
    for conn in opened:
        await conn.close()


@pytest_asyncio.fixture
async def agents(auth_fabric: AuthFabric) -> AsyncIterator[Callable[..., Awaitable[Agent]]]:
    """Start in-process agents as the workers' user, with the tenants file's policy."""
    started: list[Agent] = []

    async def start(node: str, simulate: str = "2x2GiB", **kw: Any) -> Agent:
        kw.setdefault("allow_shared_uid", True)  # the tests' own code (tests/conftest.py)
        settings = WorkerSettings(
            node=node,
            simulate=simulate,
            slice_bytes=2**30,
            heartbeat_s=0.2,
            drain_grace_s=1.0,
            kernel_modules=("tests.kernels_for_tests",),
            tenants_file=str(tenants.write_policy(auth_fabric.file.policy, auth_fabric.policy)),
            **kw,
        )
        agent = Agent(auth_fabric.worker, settings, await connect(auth_fabric.worker, name=node))
        await agent.start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        await agent.stop(grace_s=0.5)
        await agent.conn.close()


@pytest_asyncio.fixture
async def fabrics(auth_fabric: AuthFabric) -> AsyncIterator[Callable[..., Awaitable[Fabric]]]:
    """Connect fabrics as a tenant (short TTLs); closed after the test."""
    opened: list[Fabric] = []

    async def open_as(tenant: str, **kw: Any) -> Fabric:
        settings = CoordinatorSettings(
            tenant=tenant, slice_bytes=2**30, lease_ttl_s=3.0, ack_wait_s=2.0, **kw
        )
        fabric = await Fabric.connect(auth_fabric.tenant(tenant), settings)
        opened.append(fabric)
        return fabric

    yield open_as
    for fabric in opened:
        await fabric.close()
