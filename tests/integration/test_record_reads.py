"""Reads of what was just written: a record at least at one's own write, an output until there.

Direct gets are answered by any replica; one behind the write read as `removed` (a run on a
busy 3-server cluster took itself for cancelled before its first chunk), or had no output yet.
"""

from __future__ import annotations

import asyncio
import logging
import time

import attrs
import pytest

from tests.helpers import eventually
from vramfabric.broker.buckets import jobs_bucket, outputs_store
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import StaleRead
from vramfabric.broker.messages import JobRecord
from vramfabric.broker.objects import read_written_object, write_object
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator.jobs.record import read_record_at, write_record

pytestmark = pytest.mark.integration

TENANT = "t1"


async def test_a_read_behind_the_clients_own_write_is_asked_again_then_refused(
    conn: Connection, broker: BrokerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a job's record this client wrote (at sequence `seq`)
    await jobs_bucket(conn.js, broker)
    rec = JobRecord(job="r1", kernel="k", state="running", started_at=time.time())
    seq = await write_record(conn.js, broker, TENANT, rec)
    assert seq is not None and seq > 0
    # When it is read at least at that write, then it is read back
    got, at = await read_record_at(conn.js, broker, TENANT, "r1", at_least=seq)
    assert got == rec and at == seq
    # When a reader expects a later write than any replica holds (a replica behind it)
    quick = attrs.evolve(broker, retry_deadline_s=0.5, retry_pause_s=0.05)
    caplog.set_level(logging.WARNING, logger="vramfabric.broker.retrying")
    with pytest.raises(StaleRead, match=f"read at sequence {seq}, written at {seq + 1}"):
        await read_record_at(conn.js, quick, TENANT, "r1", at_least=seq + 1)
    # Then it was asked again until the retry policy's deadline, not taken for `removed`
    assert "attempt=2" in caplog.text


async def test_a_key_never_written_reads_as_absent(
    conn: Connection, broker: BrokerSettings
) -> None:
    # Given the jobs bucket without this job's record
    await jobs_bucket(conn.js, broker)
    # When it is read with no write of this client to wait for
    got, at = await read_record_at(conn.js, broker, TENANT, "never")
    # Then it is absent, at sequence 0
    assert got is None and at == 0


async def test_an_output_written_after_the_first_read_is_read_again_and_found(
    conn: Connection, broker: BrokerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a tenant's outputs store without the object yet (as a replica behind its writer
    # answers), and a reader told by a result message that it was written
    store = broker.subjects.outputs_store(TENANT)
    await outputs_store(conn.js, broker, TENANT)
    data = bytes(range(256)) * 4096  # 1 MiB
    caplog.set_level(logging.WARNING, logger="vramfabric.broker.retrying")
    reading = asyncio.create_task(read_written_object(conn.js, broker.call_retry, store, "late"))
    await eventually(lambda: "what=read object late" in caplog.text, timeout_s=20)
    assert not reading.done()
    # When the object lands while the reader waits to ask again
    await write_object(conn.js, store, "late", data, chunk_bytes=256 * 1024)
    # Then the reader gets it whole (it read `None`, a failed chunk, before)
    assert await asyncio.wait_for(reading, 30) == data


async def test_an_object_never_written_reads_as_absent_at_the_deadline(
    conn: Connection, broker: BrokerSettings
) -> None:
    # Given an outputs store without the object
    store = broker.subjects.outputs_store(TENANT)
    await outputs_store(conn.js, broker, TENANT)
    quick = attrs.evolve(broker, retry_deadline_s=0.5, retry_pause_s=0.05)
    # When it is read as written, then it is absent once the retry policy gives up
    assert await read_written_object(conn.js, quick.call_retry, store, "never") is None
