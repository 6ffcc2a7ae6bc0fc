"""With auth on, a chunk that ran out of deliveries is recorded and its work message deleted."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.authsetup import AuthFabric
from tests.helpers import eventually
from tests.kernels_for_tests import SLEEPY, executions, sleepy_input
from vramfabric.broker import RetryPolicy, tenants
from vramfabric.broker.connection import Connection, connect
from vramfabric.broker.errors import ErrorKind
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import Fabric, Gather, Job
from vramfabric.worker import Agent, WorkerSettings


async def test_an_exhausted_chunks_work_message_is_deleted_by_its_tenant(
    auth_fabric: AuthFabric,
    fabrics: Callable[..., Awaitable[Fabric]],
    connections: Callable[[BrokerSettings], Awaitable[Connection]],
    tmp_path: Path,
) -> None:
    # Given alice's job of one chunk with no retries, running on a node (its own, not the
    # fixture's: the test cuts its connection)
    settings = WorkerSettings(
        node="n-lost",
        simulate="1x2GiB",
        slice_bytes=2**30,
        heartbeat_s=0.2,
        kernel_modules=("tests.kernels_for_tests",),
        tenants_file=str(tenants.write_policy(auth_fabric.file.policy, auth_fabric.policy)),
    )
    node = Agent(auth_fabric.worker, settings, await connect(auth_fabric.worker, name="n-lost"))
    await node.start()
    try:
        await lost_mid_chunk(auth_fabric, node, fabrics, connections, tmp_path)
    finally:
        await node.abort()


async def lost_mid_chunk(
    auth_fabric: AuthFabric,
    node: Agent,
    fabrics: Callable[..., Awaitable[Fabric]],
    connections: Callable[[BrokerSettings], Awaitable[Connection]],
    tmp_path: Path,
) -> None:
    """Run alice's chunk on `node`, cut the node off mid-chunk, check what is left."""
    alice = await fabrics("alice")
    await eventually(lambda: bool(alice.fleet.adverts))
    job_id = uuid.uuid4().hex[:12]
    job = Job(
        SLEEPY,
        [sleepy_input(3)],
        args={"sleep_s": 20.0, "log_dir": str(tmp_path)},
        retry=RetryPolicy(max_retries=0),
        job_id=job_id,
    )
    run = asyncio.create_task(alice.run(job, Gather(), slices=1, timeout_s=60))
    await eventually(lambda: executions(str(tmp_path)).get(3) == 1, timeout_s=20)
    # When the node drops off the network mid-chunk (no ack, no result, no keepalive)
    await node.conn.nc.close()
    result = await run
    # Then the chunk ends as exhausted, as her coordinator recorded it
    assert result.n_failed == 1
    assert result.failures[0].error_kind is ErrorKind.EXHAUSTED
    # And her coordinator deleted its message: her work stream holds nothing of the job
    s = auth_fabric.base.subjects
    own = await connections(auth_fabric.tenant("alice"))

    async def none_queued() -> bool:
        info = await own.js.stream_info(
            s.work_stream("alice"), subjects_filter=s.work("alice", job_id)
        )
        return not info.state.subjects

    await eventually(none_queued, timeout_s=20)
