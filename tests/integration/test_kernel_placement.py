"""Placement that knows kernels: a job leases only on nodes that list its kernel, else fails."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory, WorkerProcess
from tests.kernels_for_tests import sleepy_input
from tests.kernels_one_node import ONLY_HERE
from vramfabric.broker import BrokerSettings, ChunkResult, Connection, decode
from vramfabric.broker.errors import KernelNotFound
from vramfabric.broker.packs import PackResult
from vramfabric.coordinator import Gather, Job

N_CHUNKS = 40


async def chunk_nodes(conn: Connection, broker: BrokerSettings, job_id: str) -> dict[int, str]:
    """The node each chunk of the job ran on, read from its stored results (packs included)."""
    stream = broker.subjects.results_stream("default")
    info = await conn.js.stream_info(
        stream, subjects_filter=broker.subjects.result_filter("default", job_id)
    )
    nodes: dict[int, str] = {}
    for subject in info.state.subjects or {}:
        data = (await conn.js.get_last_msg(stream, subject)).data or b""
        if subject.count(".") == 5:  # <prefix>.result.<tenant>.<job>.<first>.<last>: a pack
            pack = decode(PackResult, data)
            nodes.update((pack.first + i, pack.node) for i in range(len(pack.outputs)))
        else:
            result = decode(ChunkResult, data)
            nodes[result.index] = result.node
    return nodes


async def test_a_kernel_only_one_node_has_runs_every_chunk_on_that_node(
    conn: Connection,
    broker: BrokerSettings,
    worker_process: WorkerProcess,
    fabric_factory: FabricFactory,
) -> None:
    # Given two worker processes of 4 slices each, only one given the kernel's module
    worker_process("has", "--kernel-module", "tests.kernels_one_node")
    worker_process("lacks")
    fabric = await fabric_factory()
    await eventually(lambda: set(fabric.fleet.adverts) == {"has", "lacks"})
    # ... which their adverts say
    assert "only_here" in (fabric.fleet.adverts["has"].kernels or ())
    assert (fabric.fleet.adverts["lacks"].kernels or ()) == ("hyperparam_eval", "sleepy")
    # When a job of that kernel asks for the slices of both nodes
    job = Job(ONLY_HERE, [sleepy_input(i) for i in range(N_CHUNKS)])
    result = await fabric.run(job, Gather(), slices=8)
    # Then every chunk succeeds, on the node that has the kernel
    assert (result.n_ok, result.n_failed) == (N_CHUNKS, 0)
    assert [float(v[0]) for v in result.value] == [2.0 * i for i in range(N_CHUNKS)]
    assert await chunk_nodes(conn, broker, result.job_id) == {i: "has" for i in range(N_CHUNKS)}
    # ... having held no more leases than that node's 4 slices
    assert 0 < result.leases_peak <= 4


async def test_a_kernel_no_node_has_fails_at_once_before_any_lease(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
) -> None:
    # Given two nodes with the built-ins and the test kernels, but not `only_here`
    agents = [await agent_factory(node) for node in ("n1", "n2")]
    fabric = await fabric_factory()
    await eventually(lambda: set(fabric.fleet.adverts) == {"n1", "n2"})
    grants: list[Msg] = []

    async def granted(msg: Msg) -> None:
        grants.append(msg)

    await conn.nc.subscribe(broker.subjects.event("granted"), cb=granted)
    # When a job of `only_here` runs
    job = Job(ONLY_HERE, [sleepy_input(i) for i in range(N_CHUNKS)])
    with pytest.raises(KernelNotFound) as refused:
        await fabric.run(job, Gather(), slices=8)
    # Then the error names the kernel and what the fleet has ...
    message = str(refused.value)
    assert "'only_here'" in message
    assert "hyperparam_eval (2), sleepy (2)" in message
    assert "--kernel-module" in message
    # ... no node was asked for a lease, none was granted, and no chunk went out
    await conn.nc.flush()
    assert [a.metrics.value("gpu_lease_requests_total", op="acquire") for a in agents] == [0, 0]
    assert grants == []
    assert all(len(a.ledger) == 0 for a in agents)
    work = await conn.js.stream_info(broker.subjects.work_stream("default"))
    assert work.state.messages == 0
