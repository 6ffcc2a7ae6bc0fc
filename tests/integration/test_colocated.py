"""Nodes simulated side by side in one process: each a node of the fleet, leased and released."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.helpers import eventually
from tests.integration.conftest import FabricFactory
from vramfabric.broker import BrokerSettings
from vramfabric.broker.connection import connect
from vramfabric.coordinator.leases.leasing import LeasePool
from vramfabric.worker import WorkerSettings
from vramfabric.worker.colocated import Colocated, node_names

N_NODES = 32
GIB = 2**30


async def test_colocated_nodes_each_advertise_grant_and_release_leases(
    broker: BrokerSettings, fabric_factory: FabricFactory
) -> None:
    # Given 32 simulated nodes of one 4 GiB GPU each, in this process, on one connection
    settings = WorkerSettings(node="c", simulate="1x4GiB", slice_bytes=GIB, heartbeat_s=0.2)
    conn = await connect(broker, name="colocated")
    nodes = Colocated(broker, settings, conn, N_NODES)
    await nodes.start()
    try:
        fabric = await fabric_factory(slice_bytes=GIB, lease_ttl_s=30.0)
        # Then the fleet sees each as a node of its own
        await eventually(lambda: set(fabric.fleet.adverts) == set(node_names("c", N_NODES)))
        # When a pool asks for 100 of their 128 slices
        pool = LeasePool(fabric.conn, fabric.broker, fabric.settings, fabric.fleet, "wide")
        assert await pool.acquire(100) == 100
        # Then they come from every node, each node's own ledger holding its part
        per_node = Counter(lease.node for lease in pool.leases.values())
        assert set(per_node) == set(node_names("c", N_NODES))
        assert {a.settings.node: len(a.ledger) for a in nodes.agents} == dict(per_node)
        # And once released, every node's VRAM is free again, as its advert says
        assert await pool.release() == 100
        await eventually(lambda: fabric.fleet.free_slices(GIB) == 4 * N_NODES)
    finally:
        await nodes.stop(grace_s=0.5)
        await conn.close()


def test_colocated_nodes_need_simulated_gpus(broker: BrokerSettings) -> None:
    with pytest.raises(ValueError, match="--simulate"):
        Colocated(broker, WorkerSettings(node="c"), None, 2)  # type: ignore[arg-type]
