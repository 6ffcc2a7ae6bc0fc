"""Placement against a real server: a job's leases spread over every GPU of every node."""

from __future__ import annotations

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.coordinator.leases.leasing import LeasePool

MIB = 2**20


async def test_a_1000_lease_job_on_4_nodes_of_4_gpus_lands_on_all_16_gpus(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given four in-process nodes of four 48 GiB GPUs, 512 MiB slices (96 per GPU)
    nodes = ("n1", "n2", "n3", "n4")
    agents = [
        await agent_factory(node, simulate="4x48GiB", slice_bytes=512 * MIB) for node in nodes
    ]
    fabric = await fabric_factory(slice_bytes=512 * MIB, lease_ttl_s=30.0)
    await eventually(lambda: set(fabric.fleet.adverts) == set(nodes))
    # When a pool with the default placement asks for 1000 leases
    assert fabric.settings.placement == "spread"
    pool = LeasePool(fabric.conn, fabric.broker, fabric.settings, fabric.fleet, "wide")
    assert await pool.acquire(1000) == 1000
    # Then every one of the 16 GPUs holds some of them
    used = {(lease.node, lease.gpu) for lease in pool.leases.values()}
    assert used == {(node, gpu) for node in nodes for gpu in range(4)}
    assert sum(len(agent.ledger) for agent in agents) == 1000
    assert await pool.release() == 1000
