"""A result the server refuses for good (too large, not permitted) fails its chunk at once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker import BrokerSettings, ErrorKind, RetryPolicy
from vramfabric.broker.acked import AckedPublisher
from vramfabric.broker.connection import connect
from vramfabric.broker.errors import PermissionDenied
from vramfabric.broker.server import NatsServer
from vramfabric.coordinator import Job
from vramfabric.coordinator.aggregate import Gather

MAX_PAYLOAD_BYTES = 64 * 2**10
RETRY = RetryPolicy(max_retries=3, initial_backoff_s=0.1, max_backoff_s=0.5)


def start_server(tmp_path: Path, config: str) -> NatsServer:
    """A nats-server of its own, with `config` (the session's server has the defaults)."""
    path = tmp_path / "server.conf"
    # A config's listen wins over the command line's port: pick a free one here too.
    path.write_text(f'listen: "127.0.0.1:-1"\njetstream: enabled\n{config}')
    return NatsServer(config_file=str(path), store_dir=str(tmp_path / "js")).start()


@pytest.fixture(scope="module")
def small_payload_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server whose max_payload is 64 KiB, below the worker's inline output limit."""
    server = start_server(tmp_path_factory.mktemp("small"), f"max_payload: {MAX_PAYLOAD_BYTES}\n")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def broker(small_payload_url: str) -> BrokerSettings:
    """The agents and fabrics of this module's tests use the small-payload server."""
    return BrokerSettings(url=small_payload_url, prefix=f"t{uuid.uuid4().hex[:8]}", node_ttl_s=2.0)


def big_output(n_bytes: int) -> bytes:
    """An output over the server's max_payload, yet small enough to travel inline."""
    return b"x" * n_bytes


async def test_result_over_max_payload_fails_its_chunk_at_once(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a worker whose inline outputs may be larger than the server's max_payload
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    job = Job(big_output, [2 * MAX_PAYLOAD_BYTES], retry=RETRY)
    # When a chunk's result is too large to publish
    t0 = time.monotonic()
    result = await fabric.run(job, Gather(), timeout_s=30)
    # Then the chunk fails on its first delivery, naming why, and the run ends promptly
    assert (result.n_ok, result.n_failed) == (0, 1)
    failure = result.failures[0]
    assert failure.error_kind is ErrorKind.RESULT_REFUSED
    assert failure.error is not None and "result not stored" in failure.error
    assert "MaxPayloadError" in failure.error
    assert failure.attempt == 1
    assert time.monotonic() - t0 < 10
    assert agent.metrics.value("gpu_submit_total") == 1


@pytest.fixture(scope="module")
def auth_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with a user that may publish anywhere but on result subjects."""
    config = """
authorization {
  users = [
    {user: "limited", password: "pw", permissions: {publish: {deny: ["*.result.>"]}}}
  ]
}
"""
    server = start_server(tmp_path_factory.mktemp("auth"), config)
    try:
        yield server.url
    finally:
        server.stop()


async def test_publish_refused_by_permissions_fails_promptly_as_permission_denied(
    auth_url: str,
) -> None:
    # Given a user who may not publish results, and a stream that would take them
    settings = BrokerSettings(url=auth_url, user="limited", password="pw")
    conn = await connect(settings, name="limited")
    subject = settings.subjects.result("default", "job1", 0)
    acks = await AckedPublisher(conn.nc, timeout_s=10.0).start()
    try:
        await conn.js.add_stream(name=f"R{uuid.uuid4().hex[:8]}", subjects=[subject])
        # When it publishes a result
        t0 = time.monotonic()
        with pytest.raises(PermissionDenied):
            await acks.publish(subject, b"result")
        # Then the server's refusal surfaces at once, not as a (transient) PubAck timeout
        assert time.monotonic() - t0 < 2.0
        # And a permitted publish on the same publisher still gets its PubAck
        other = settings.subjects.work("default", "job1")
        await conn.js.add_stream(name=f"W{uuid.uuid4().hex[:8]}", subjects=[other])
        assert await acks.publish(other, b"chunk") is False
    finally:
        await acks.stop()
        await conn.close()
