"""What a job has queued in the work stream when it runs again.

A rerun of a job whose coordinator died finds chunks it left queued: `queued_chunks` names
them, and they run from the queue under the new run's leases instead of being published
again (this run may pack them otherwise, under other message ids, and they would run twice).

Chunks the stream took for duplicates of messages that are no longer queued:

The work stream deduplicates `Nats-Msg-Id`s for its window (2 minutes): a resumed job's
chunks still queued are not queued twice. But a chunk whose message was purged (`vramfabric
rm` or `cancel`, then the same job again) or consumed without a result is also "a
duplicate" inside the window, and nothing would run it: the job waited for ever. Those are
found by the sequence the stream acknowledged them with, and published again under a fresh
id. A message is also gone once a worker ran it and acked it, which leases of the job's
earlier run (a killed coordinator's, still live until their TTL) go on doing while the rerun
submits: a chunk whose result is stored is done, not gone, and running it again would only
cost a slice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Sequence

import nats.js.errors

from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import nats_errors
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import HEADER_MSG_ID

log = logging.getLogger(__name__)

Span = tuple[int, int]
# Messages looked up at once.
_WINDOW = 64


async def queued_chunks(conn: Connection, broker: BrokerSettings, spec: JobSpec) -> set[int]:
    """The job's chunks in its queued work messages (read one by one: a resume's only).

    Under the call retry policy: a read, done again whole after a timeout (a busy cluster's
    API answered one too late, and the run died before its first chunk).
    """
    read = functools.partial(_read_queued, conn, broker, spec)
    return await broker.call_retry.call(read, what=f"read queued chunks job={spec.job_id}")


async def _read_queued(conn: Connection, broker: BrokerSettings, spec: JobSpec) -> set[int]:
    s = broker.subjects
    stream = s.work_stream(spec.tenant)
    subject = s.work(spec.tenant, spec.job_id)
    with nats_errors():
        info = await conn.js.stream_info(stream, subjects_filter=subject)
        left = sum((info.state.subjects or {}).values())
        chunks: set[int] = set()
        seq = info.state.first_seq
        while left > 0:
            try:
                msg = await conn.js.get_msg(stream, seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                break  # the rest were acked while being read: nothing left queued
            span = s.chunk_range_of((msg.headers or {}).get(HEADER_MSG_ID, ""))
            if span is not None:
                chunks.update(range(span[0], span[1] + 1))
            seq, left = (msg.seq or seq) + 1, left - 1
    if chunks:
        log.info("chunks queued by an earlier run job=%s chunks=%d", spec.job_id, len(chunks))
    return chunks


async def not_queued(
    conn: Connection, broker: BrokerSettings, spec: JobSpec, repeats: Sequence[tuple[Span, int]]
) -> list[Span]:
    """The spans of `repeats` (span, first message's sequence) whose message is gone.

    Reads only, under the call retry policy.
    """
    look = functools.partial(_not_queued, conn, broker, spec, repeats)
    return await broker.call_retry.call(look, what=f"look up repeats job={spec.job_id}")


async def _not_queued(
    conn: Connection, broker: BrokerSettings, spec: JobSpec, repeats: Sequence[tuple[Span, int]]
) -> list[Span]:
    s = broker.subjects
    stream = s.work_stream(spec.tenant)
    with nats_errors():
        info = await conn.js.stream_info(stream, subjects_filter=s.work(spec.tenant, spec.job_id))
    # As many of the job's messages queued as repeats: nothing was lost (the usual resume,
    # a million chunks maybe), so no message is looked up one by one.
    if sum((info.state.subjects or {}).values()) >= len(repeats):
        return []
    results = s.results_stream(spec.tenant)
    gone: list[Span] = []
    for start in range(0, len(repeats), _WINDOW):
        window = repeats[start : start + _WINDOW]
        found = await asyncio.gather(*(_queued(conn, stream, seq) for _span, seq in window))
        missing = [span for (span, _seq), there in zip(window, found, strict=True) if not there]
        # Looked up after the work message: a worker stores the result before its ack.
        done = await asyncio.gather(
            *(
                _stored(conn, results, s.result(spec.tenant, spec.job_id, *_ends(span)))
                for span in missing
            )
        )
        gone += [span for span, there in zip(missing, done, strict=True) if not there]
    if gone:
        log.info("chunks queued again job=%s chunks=%d", spec.job_id, len(gone))
    return gone


def _ends(span: Span) -> tuple[int, int | None]:
    """A span's first chunk, and its last where it is a pack (as its result subject names it)."""
    first, last = span
    return first, (None if first == last else last)


async def _stored(conn: Connection, stream: str, subject: str) -> bool:
    return await _found(conn.js.get_last_msg(stream, subject))


async def _queued(conn: Connection, stream: str, seq: int) -> bool:
    return await _found(conn.js.get_msg(stream, seq))


async def _found(lookup: Awaitable[object]) -> bool:
    """Whether a message lookup found its message (not found is an answer, not an error)."""
    with nats_errors():
        try:
            await lookup
        except nats.js.errors.NotFoundError:
            return False
    return True
