"""Chunks the stream took for duplicates of messages that are no longer queued.

The work stream deduplicates `Nats-Msg-Id`s for its window (2 minutes): a resumed job's
chunks still queued are not queued twice. But a chunk whose message was purged (`vramfabric
rm` or `cancel`, then the same job again) or consumed without a result is also "a
duplicate" inside the window, and nothing would run it: the job waited for ever. Those are
found by the sequence the stream acknowledged them with, and published again under a fresh
id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import nats.js.errors

from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import nats_errors
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.settings import BrokerSettings

log = logging.getLogger(__name__)

Span = tuple[int, int]
# Messages looked up at once.
_WINDOW = 64


async def not_queued(
    conn: Connection, broker: BrokerSettings, spec: JobSpec, repeats: Sequence[tuple[Span, int]]
) -> list[Span]:
    """The spans of `repeats` (span, first message's sequence) whose message is gone."""
    s = broker.subjects
    stream = s.work_stream(spec.tenant)
    with nats_errors():
        info = await conn.js.stream_info(stream, subjects_filter=s.work(spec.tenant, spec.job_id))
    # As many of the job's messages queued as repeats: nothing was lost (the usual resume,
    # a million chunks maybe), so no message is looked up one by one.
    if sum((info.state.subjects or {}).values()) >= len(repeats):
        return []
    gone: list[Span] = []
    for start in range(0, len(repeats), _WINDOW):
        window = repeats[start : start + _WINDOW]
        found = await asyncio.gather(*(_queued(conn, stream, seq) for _span, seq in window))
        gone += [span for (span, _seq), there in zip(window, found, strict=True) if not there]
    if gone:
        log.info("chunks queued again job=%s chunks=%d", spec.job_id, len(gone))
    return gone


async def _queued(conn: Connection, stream: str, seq: int) -> bool:
    with nats_errors():
        try:
            await conn.js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            return False
    return True
