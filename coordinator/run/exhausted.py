"""Exhausted chunks: a chunk that ran out of deliveries gets a final `exhausted` result.

JetStream leaves such a chunk in the work-queue stream and sends a max-deliveries advisory
(captured in the tenant's dead-letter stream). For each advisory of the job's consumer this
reads the chunk (or pack), records a failed result for it (first result wins, so a late real
result that already landed is kept), and deletes the chunk from the work stream.
"""

from __future__ import annotations

import json
import logging

import attrs
from nats.aio.msg import Msg

from vramfabric.broker.codec import decode_one_of, encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import (
    ErrorKind,
    InvalidMessage,
    PermanentError,
    ResultAlreadyRecorded,
    TransientError,
    VramfabricError,
)
from vramfabric.broker.messages import Chunk, ChunkResult, JobSpec
from vramfabric.broker.packs import ChunkPack, PackResult
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import HEADER_MSG_ID, MAX_PACK_CHUNKS, Subjects

from ..jobs.job import Span
from .follow import Follower

log = logging.getLogger(__name__)


@attrs.define
class ExhaustedWatcher:
    """Turns one job's max-deliveries advisories into `exhausted` results."""

    conn: Connection
    broker: BrokerSettings
    spec: JobSpec
    _follower: Follower | None = attrs.field(default=None, init=False)

    async def start(self) -> None:
        """Replay the job consumer's advisories from the dead-letter stream, then follow it."""
        s = self.broker.subjects
        work = s.work_stream(self.spec.tenant)
        self._follower = Follower(
            self.conn,
            s.max_deliveries(work, s.job_consumer(self.spec.job_id)),
            s.dead_stream(self.spec.tenant),
            self._on_advisory,
            self.broker.call_retry,
        )
        await self._follower.start()

    async def _on_advisory(self, msg: Msg) -> None:
        try:
            advisory = json.loads(msg.data)
            seq = int(advisory["stream_seq"])
            deliveries = int(advisory.get("deliveries", 0))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("bad max-deliveries advisory ignored error=%s", exc)
            return
        stream = self.broker.subjects.work_stream(self.spec.tenant)
        policy = self.broker.call_retry
        try:
            raw = await policy.call(
                lambda: self.conn.js.get_msg(stream, seq), what=f"read exhausted chunk seq={seq}"
            )
        except PermanentError as exc:  # gone: dead-lettered by an earlier run, or acked after all
            log.debug("exhausted chunk not there seq=%d error=%s", seq, exc)
            return
        except TransientError as exc:
            log.warning("exhausted chunk unreadable seq=%d error=%s", seq, exc)
            return
        span = _span(raw.data or b"", raw.headers)
        if span is not None and not await self._record(span, deliveries):
            return  # kept in the work stream: a rerun finds the chunk without a result
        try:
            await policy.call(
                lambda: self.conn.js.delete_msg(stream, seq), what=f"delete exhausted seq={seq}"
            )
        except VramfabricError as exc:
            log.warning("exhausted chunk not deleted seq=%d error=%s", seq, exc)

    async def _record(self, span: Span, deliveries: int) -> bool:
        """Store the `exhausted` result of a chunk or pack; whether it now has a result."""
        first, last = span
        results = tuple(
            ChunkResult(
                job=self.spec.job_id,
                index=index,
                ok=False,
                error_kind=ErrorKind.EXHAUSTED,
                error=f"no result after {deliveries} deliveries (max_deliver reached)",
                attempt=deliveries,
            )
            for index in range(first, last + 1)
        )
        s, job = self.broker.subjects, self.spec.job_id
        if first == last:
            subject, data = s.result(self.spec.tenant, job, first), encode(results[0])
        else:
            subject = s.result(self.spec.tenant, job, first, last)
            pack = PackResult(job=job, first=first, outputs=(None,) * len(results), others=results)
            data = encode(pack)
        try:
            await self.broker.call_retry.call(
                lambda: self.conn.js.publish(subject, data),
                what=f"record exhausted chunks {first}-{last}",
            )
        except ResultAlreadyRecorded:
            return True
        except VramfabricError as exc:
            log.warning("exhausted result not recorded index=%d error=%s", first, exc)
            return False
        log.warning(
            "chunks exhausted job=%s first=%d last=%d deliveries=%d", job, first, last, deliveries
        )
        return True

    async def stop(self) -> None:
        """Stop following advisories."""
        if self._follower is not None:
            await self._follower.stop()


def _span(data: bytes, headers: dict[str, str] | None) -> Span | None:
    """(first, last) chunk of a work message: from its payload, else from its Msg-Id."""
    try:
        work = decode_one_of((Chunk, ChunkPack), data)
    except InvalidMessage:
        span = Subjects.chunk_range_of((headers or {}).get(HEADER_MSG_ID, ""))
        return span if span is not None and span[1] - span[0] < MAX_PACK_CHUNKS else None
    return (work.index, work.index) if isinstance(work, Chunk) else (work.first, work.last)
