"""A job's record is read back at least at this client's own write.

Direct gets are answered by any replica; one behind the write read as `removed`, and a run on
a busy 3-server cluster took itself for cancelled before its first chunk.
"""

from __future__ import annotations

import time

import attrs
import pytest

from vramfabric.broker.buckets import jobs_bucket
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import StaleRead
from vramfabric.broker.messages import JobRecord
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator.record import read_record_at, write_record

pytestmark = pytest.mark.integration

TENANT = "t1"


async def test_a_read_behind_the_clients_own_write_is_asked_again_then_refused(
    conn: Connection, broker: BrokerSettings
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
    t0 = time.monotonic()
    with pytest.raises(StaleRead, match=f"read at sequence {seq}, written at {seq + 1}"):
        await read_record_at(conn.js, quick, TENANT, "r1", at_least=seq + 1)
    # Then it was asked again until the retry policy's deadline, not taken for `removed`
    assert time.monotonic() - t0 >= 0.5


async def test_a_key_never_written_reads_as_absent(
    conn: Connection, broker: BrokerSettings
) -> None:
    # Given the jobs bucket without this job's record
    await jobs_bucket(conn.js, broker)
    # When it is read with no write of this client to wait for
    got, at = await read_record_at(conn.js, broker, TENANT, "never")
    # Then it is absent, at sequence 0
    assert got is None and at == 0
