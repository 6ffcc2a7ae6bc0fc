"""AckedPublisher against a real server: PubAcks, refusals, no stream, and silence."""

from __future__ import annotations

import time

import pytest

from vramfabric.broker import topology
from vramfabric.broker.acked import AckedPublisher
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import Disconnected, ResultAlreadyRecorded, from_nats
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import HEADER_MSG_ID


async def test_second_result_of_a_chunk_is_refused_not_left_hanging(
    conn: Connection, broker: BrokerSettings
) -> None:
    # Given a tenant's results stream (one message per subject: the first result wins)
    await topology.ensure_tenant(conn.js, broker, "default")
    acks = await AckedPublisher(conn.nc, timeout_s=5.0).start()
    subject = broker.subjects.result("default", "job1", 0)
    try:
        # When a result is published, then the same msg id again, then another result
        first = await acks.publish(subject, b"one", {HEADER_MSG_ID: "job1:0:a"})
        again = await acks.publish(subject, b"one", {HEADER_MSG_ID: "job1:0:a"})
        with pytest.raises(Exception) as refused:
            await acks.publish(subject, b"two", {HEADER_MSG_ID: "job1:0:b"})
    finally:
        await acks.stop()
    # Then the first is stored, the repeat is a duplicate, and the second result is refused
    # as already recorded (nats-py's publish_async never resolves this one: nats.py #985)
    assert (first, again) == (False, True)
    assert isinstance(from_nats(refused.value), ResultAlreadyRecorded)
    stored = await conn.js.get_last_msg(broker.subjects.results_stream("default"), subject)
    assert stored.data == b"one"


async def test_publish_without_a_stream_fails_fast(
    conn: Connection, broker: BrokerSettings
) -> None:
    # Given no stream on a subject
    acks = await AckedPublisher(conn.nc, timeout_s=5.0).start()
    try:
        # When a publish goes there, then it fails at once as disconnected (no responders)
        t0 = time.monotonic()
        with pytest.raises(Exception) as failed:
            await acks.publish(f"{broker.prefix}.nowhere", b"x")
    finally:
        await acks.stop()
    assert isinstance(from_nats(failed.value), Disconnected)
    assert time.monotonic() - t0 < 4.0


async def test_publish_with_no_puback_times_out(conn: Connection, broker: BrokerSettings) -> None:
    # Given a plain subscriber that never answers (a stream whose leader is gone, say)
    subject = f"{broker.prefix}.silent"
    sub = await conn.nc.subscribe(subject)
    acks = await AckedPublisher(conn.nc, timeout_s=0.3).start()
    try:
        # When a publish goes there, then it fails as timed out (a transient error)
        with pytest.raises(Exception) as failed:
            await acks.publish(subject, b"x")
    finally:
        await acks.stop()
        await sub.unsubscribe()
    assert isinstance(from_nats(failed.value), Disconnected)
    assert "timed out" in str(from_nats(failed.value))
