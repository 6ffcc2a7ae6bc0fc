"""Exhausted chunks: a chunk that ran out of deliveries gets a final `exhausted` result.

JetStream leaves such a chunk in the work-queue stream and sends a max-deliveries advisory
(captured in the tenant's dead-letter stream). For each advisory of the job's consumer this
reads the chunk, records a failed result (first result wins, so a late real result that
already landed is kept), and deletes the chunk from the work stream.
"""

from __future__ import annotations

import json
import logging

import attrs
from nats.aio.msg import Msg

from vramfabric.broker.codec import decode, encode
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
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import HEADER_MSG_ID, Subjects

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
        index = _index(raw.data or b"", raw.headers)
        if index is not None and not await self._record(index, deliveries):
            return  # kept in the work stream: a rerun finds the chunk without a result
        try:
            await policy.call(
                lambda: self.conn.js.delete_msg(stream, seq), what=f"delete exhausted seq={seq}"
            )
        except VramfabricError as exc:
            log.warning("exhausted chunk not deleted seq=%d error=%s", seq, exc)

    async def _record(self, index: int, deliveries: int) -> bool:
        """Store the chunk's `exhausted` result; whether the chunk now has a result."""
        result = ChunkResult(
            job=self.spec.job_id,
            index=index,
            ok=False,
            error_kind=ErrorKind.EXHAUSTED,
            error=f"no result after {deliveries} deliveries (max_deliver reached)",
            attempt=deliveries,
        )
        subject = self.broker.subjects.result(self.spec.tenant, self.spec.job_id, index)
        try:
            await self.broker.call_retry.call(
                lambda: self.conn.js.publish(subject, encode(result)),
                what=f"record exhausted chunk index={index}",
            )
        except ResultAlreadyRecorded:
            return True
        except VramfabricError as exc:
            log.warning("exhausted result not recorded index=%d error=%s", index, exc)
            return False
        log.warning(
            "chunk exhausted job=%s index=%d deliveries=%d", self.spec.job_id, index, deliveries
        )
        return True

    async def stop(self) -> None:
        """Stop following advisories."""
        if self._follower is not None:
            await self._follower.stop()


def _index(data: bytes, headers: dict[str, str] | None) -> int | None:
    """The chunk index of a work message: from its payload, else from its Msg-Id."""
    try:
        return decode(Chunk, data).index
    except InvalidMessage:
        return Subjects.chunk_index_of((headers or {}).get(HEADER_MSG_ID, ""))
