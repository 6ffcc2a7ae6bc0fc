"""CallRetry against a real nats-server that goes away: publishes and connects ride it out.

Each test runs its own server (the session's must stay up for the others), kills it -9,
waits until the policy has really logged a retry, then starts it again on the same port
and store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import eventually
from tests.kernels_for_tests import SLEEPY, sleepy_input
from vramfabric.broker import BrokerSettings, NatsServer, connect, topology
from vramfabric.coordinator import CoordinatorSettings, Job
from vramfabric.coordinator.jobs.publish import submit_chunks
from vramfabric.worker.__main__ import connect_patiently

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server for this test alone, with a store that survives kill -9."""
    server = NatsServer(store_dir=str(tmp_path / "js")).start()
    try:
        yield server
    finally:
        server.stop()


def _retries_logged(caplog: pytest.LogCaptureFixture, what: str) -> bool:
    return any(
        r.name == "vramfabric.broker.retrying" and f"what={what}" in r.getMessage()
        for r in caplog.records
    )


async def test_chunk_submission_rides_out_a_server_outage(
    own_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a coordinator connected to a server with the tenant's streams
    caplog.set_level(logging.WARNING, "vramfabric.broker.retrying")
    broker = BrokerSettings(url=own_server.url, prefix="out", retry_deadline_s=60.0)
    conn = await connect(broker, name="outage")
    try:
        job = Job(SLEEPY, [sleepy_input(i) for i in range(20)])
        spec = job.spec(CoordinatorSettings())
        await topology.ensure_tenant(conn.js, broker, spec.tenant)
        # When the server dies and chunks are submitted meanwhile
        own_server.kill()
        submit = asyncio.create_task(
            submit_chunks(conn, broker, spec, job.encoded, range(len(job.encoded)))
        )
        # (the policy really retried a failed publish round)
        await eventually(lambda: _retries_logged(caplog, "submit chunks"), timeout_s=30)
        assert not submit.done()
        # and then the server comes back on its port and store
        own_server.start()
        await asyncio.wait_for(submit, 60)
        # Then every chunk is in the work stream exactly once
        info = await conn.js.stream_info(broker.subjects.work_stream(spec.tenant))
        assert info.state.messages == len(job.encoded)
    finally:
        await conn.close()


async def test_a_worker_connect_waits_for_a_server_that_starts_late(
    own_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Given no server where the worker will connect
    caplog.set_level(logging.WARNING, "vramfabric.broker.retrying")
    broker = BrokerSettings(url=own_server.url, prefix="late", connect_timeout_s=0.5)
    own_server.kill()
    # When the worker connects, retrying, and the server starts meanwhile
    connecting = asyncio.create_task(connect_patiently(broker, "late-node"))
    await eventually(lambda: _retries_logged(caplog, "connect"), timeout_s=20)
    own_server.start()
    conn = await asyncio.wait_for(connecting, 30)
    # Then the connection works: JetStream answers through it
    try:
        account = await conn.js.account_info()
        assert account.streams == 0
    finally:
        await conn.close()
