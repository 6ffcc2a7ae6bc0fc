"""GPU tests: skipped, each with the reason, where there is no CUDA; fixtures for a real GPU.

They cannot run on this project's CI machine (no GPU); on a machine with an NVIDIA GPU,
`pip install '.[test,gpu]'` and `python -m pytest tests/gpu` runs them.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import pytest_asyncio

from tests.helpers import eventually
from vramfabric.broker import BrokerSettings, connect
from vramfabric.coordinator import CoordinatorSettings, Fabric
from vramfabric.worker import Agent, WorkerSettings


def cuda_missing() -> str:
    """Why CUDA cannot be used here, or "" when a device answers."""
    try:
        import cupy
    except ImportError:
        return "no CUDA: cupy is not installed (pip install 'vramfabric[gpu]' on a GPU machine)"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return f"no CUDA device: {exc}"
    return "" if count else "no CUDA device: the driver reports 0 GPUs"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every test of this folder, with the reason, when CUDA is missing."""
    here = Path(__file__).parent
    mine = [item for item in items if Path(str(item.fspath)).parent == here]
    reason = cuda_missing() if mine else ""
    for item in mine if reason else ():
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def cupy() -> ModuleType:
    """The CuPy module (tests here run only where it imports and sees a device)."""
    return importlib.import_module("cupy")


GpuAgent = Callable[..., Awaitable[Agent]]


@pytest_asyncio.fixture
async def gpu_agent(broker: BrokerSettings) -> AsyncIterator[GpuAgent]:
    """Start agents on this machine's real GPUs (NVML); stop them after."""
    agents: list[Agent] = []

    async def make(node: str, slice_bytes: int = 2**30, **kw: Any) -> Agent:
        settings = WorkerSettings(
            node=node, slice_bytes=slice_bytes, heartbeat_s=0.2, drain_grace_s=1.0, **kw
        )
        agent = Agent(broker, settings, await connect(broker, name=node))
        await agent.start()
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        await agent.stop(grace_s=0.5)
        await agent.conn.close()


@pytest_asyncio.fixture
async def gpu_fabric(broker: BrokerSettings) -> AsyncIterator[Callable[..., Awaitable[Fabric]]]:
    """Connect fabrics with short TTLs and ack waits; close them after."""
    fabrics: list[Fabric] = []

    async def make(**kw: object) -> Fabric:
        defaults: dict[str, object] = {"slice_bytes": 2**30, "lease_ttl_s": 5.0, "ack_wait_s": 2.0}
        defaults.update(kw)
        fabric = await Fabric.connect(broker, CoordinatorSettings(**defaults))  # type: ignore[arg-type]
        await eventually(lambda: bool(fabric.fleet.adverts))
        fabrics.append(fabric)
        return fabric

    yield make
    for fabric in fabrics:
        await fabric.close()
