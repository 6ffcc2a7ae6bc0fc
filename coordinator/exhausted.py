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
import nats.js.errors
from nats.aio.msg import Msg

from vramfabric.broker.codec import decode, encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import ErrorKind, InvalidMessage, ResultAlreadyRecorded, from_nats
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
            seq = int(json.loads(msg.data)["stream_seq"])
            deliveries = int(json.loads(msg.data).get("deliveries", 0))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("bad max-deliveries advisory ignored error=%s", exc)
            return
        stream = self.broker.subjects.work_stream(self.spec.tenant)
        try:
            raw = await self.conn.js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            return  # already dead-lettered by an earlier run, or acked after all
        except Exception as exc:
            log.warning("exhausted chunk unreadable seq=%d error=%s", seq, from_nats(exc))
            return
        index = _index(raw.data or b"", raw.headers)
        if index is not None:
            await self._record(index, deliveries)
        try:
            await self.conn.js.delete_msg(stream, seq)
        except Exception as exc:
            log.warning("exhausted chunk not deleted seq=%d error=%s", seq, from_nats(exc))

    async def _record(self, index: int, deliveries: int) -> None:
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
            await self.conn.js.publish(subject, encode(result))
            log.warning(
                "chunk exhausted job=%s index=%d deliveries=%d", self.spec.job_id, index, deliveries
            )
        except Exception as exc:
            err = from_nats(exc)
            if not isinstance(err, ResultAlreadyRecorded):
                log.warning("exhausted result not recorded index=%d error=%s", index, err)

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
