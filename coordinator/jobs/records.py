"""RecordReader: a tenant's run records read in stream order, by pages, newest or oldest first.

Each run record is one message on `$KV.<jobs bucket>.<tenant>.<job>.state` (history 1), so
the bucket's stream holds the records in the order they were last written: a job that
finished or was cancelled last is last. A page is read with one ephemeral pull consumer
from a start sequence, never by listing the bucket's keys or the streams' subjects, so a
page costs the same whatever the number of jobs and results stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import attrs
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, nats_errors
from vramfabric.broker.messages import JobRecord
from vramfabric.broker.settings import BrokerSettings

log = logging.getLogger(__name__)

# Records fetched per pull.
_BATCH = 1000
# The first look back for the newest page spans this many stream sequences per record wanted.
_SPAN_PER_RECORD = 4
# Headers marking a KV delete or purge (a removed job's record).
_MARKERS = ("KV-Operation", "Nats-Marker-Reason")


@attrs.frozen
class StoredRecord:
    """One run record as stored: its job, its record (None if it does not decode), when written."""

    job: str
    record: JobRecord | None
    seq: int
    written_at: float  # unix s, the server's timestamp of the record's last write
    error: str = ""


@attrs.define
class RecordReader:
    """Reads one tenant's run records from the jobs bucket's stream."""

    conn: Connection
    broker: BrokerSettings
    tenant: str

    @property
    def _stream(self) -> str:
        s = self.broker.subjects
        return s.kv_stream(s.jobs_bucket())

    async def count(self) -> int:
        """How many records the tenant has (removed jobs' delete markers included, if any)."""
        return await self._pending(1)

    async def newest(self, limit: int) -> list[StoredRecord]:
        """The `limit` records written last, oldest of them first.

        Looks back from the stream's end over a span that grows fourfold until it holds
        `limit` records (counted by consumers, nothing fetched), then reads that span once.
        """
        with nats_errors():
            try:
                info = await self.conn.js.stream_info(self._stream)
            except nats.js.errors.NotFoundError:  # no job was ever stored
                return []
        last = info.state.last_seq or 0
        span = max(limit * _SPAN_PER_RECORD, _BATCH)
        while True:
            start = max(1, last - span + 1)
            if start == 1 or await self._pending(start) >= limit:
                break
            span *= 4
        records = await self.read_page(start)
        return records[-limit:]

    async def read(self, start_seq: int = 1) -> AsyncIterator[StoredRecord]:
        """Every record of the tenant from `start_seq` on, in stream order (oldest first).

        Pushed by an ordered consumer (flow-controlled by the server) into a callback, in
        batches of _BATCH: pulling them, or awaiting them one by one, cost several times as
        much per record here.
        """
        pending = await self._pending(start_seq)
        if pending == 0:
            return
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq,
            mem_storage=True,
        )
        batch: list[Msg] = []
        seen = 0
        ready = asyncio.Event()

        async def take(msg: Msg) -> None:
            nonlocal seen
            batch.append(msg)
            seen += 1
            if len(batch) >= _BATCH or seen >= pending:
                ready.set()

        subject = self.broker.subjects.job_records(self.tenant)
        with nats_errors():
            sub = await self.conn.js.subscribe(
                subject, stream=self._stream, ordered_consumer=True, config=config, cb=take
            )
        try:
            done, quiet = 0, False
            while done < pending and not quiet:
                try:
                    await asyncio.wait_for(ready.wait(), self._timeout_s)
                except TimeoutError:
                    # Fewer came than were counted: records removed meanwhile (an `rm`).
                    log.debug("records stopped coming tenant=%s read=%d", self.tenant, seen)
                    quiet = True
                ready.clear()
                msgs, batch[:] = list(batch), []
                done += len(msgs)
                for record in map(self._parse, msgs):
                    if record is not None:
                        yield record
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def read_page(self, start_seq: int) -> list[StoredRecord]:
        """The records from `start_seq` on, pulled (for a page: no consumer left pushing)."""
        return [record async for record in self.pull(start_seq)]

    async def pull(self, start_seq: int = 1, batch: int = _BATCH) -> AsyncIterator[StoredRecord]:
        """The records from `start_seq` on, pulled `batch` at a time as the caller goes on.

        For a reader that may stop early (the retention's sweep stops at its cutoff): only
        what it reads is fetched, where `read` has the server push every record.
        """
        sub, pending = await self._consumer(start_seq)
        if sub is None:
            return
        try:
            while pending > 0:
                # Never ask for more than remain: fetch(n) holds what arrived until n do.
                with nats_errors():
                    msgs = await sub.fetch(min(pending, batch), timeout=self._timeout_s)
                pending -= len(msgs)
                for record in map(self._parse, msgs):
                    if record is not None:
                        yield record
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    @property
    def _timeout_s(self) -> float:
        return self.broker.request_timeout_s

    async def _pending(self, start_seq: int) -> int:
        sub, pending = await self._consumer(start_seq)
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        return pending

    async def _consumer(
        self, start_seq: int
    ) -> tuple[JetStreamContext.PullSubscription | None, int]:
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq,
            inactive_threshold=10.0,  # the server cleans up after a client that died
            mem_storage=True,
        )
        subject = self.broker.subjects.job_records(self.tenant)
        with nats_errors():
            try:
                sub = await self.conn.js.pull_subscribe(subject, stream=self._stream, config=config)
            except nats.js.errors.NotFoundError:  # no job was ever stored
                return None, 0
            pending = (await sub.consumer_info()).num_pending or 0
        return sub, pending

    def _parse(self, msg: Msg) -> StoredRecord | None:
        headers = msg.headers or {}
        if any(marker in headers for marker in _MARKERS) or not msg.data:
            return None  # a removed job
        meta = msg.metadata
        job = msg.subject.rsplit(".", 2)[-2]
        written_at = meta.timestamp.timestamp() if meta.timestamp else 0.0
        seq = meta.sequence.stream
        try:
            return StoredRecord(job, decode(JobRecord, msg.data), seq, written_at)
        except InvalidMessage as exc:  # listed as unreadable, so that `rm` can take it away
            return StoredRecord(job, None, seq, written_at, error=str(exc))
