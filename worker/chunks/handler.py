"""ChunkHandler: one chunk (or pack) on one lease, from its message to its stored result and ack.

Order matters for at-least-once delivery with nothing lost: the result is stored (its
PubAck is back) before the work message is acked; a transient failure naks with the retry
policy's delay; a permanent one stores a failed result and terminates the message. A pack
(several tiny chunks in one message) is handled the same way, whole: one result message
holds every chunk's outcome, and a transient failure delivers the pack again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs
from nats.aio.msg import Msg
from prometheus_client import Counter, Histogram

from vramfabric.broker.acked import AckedPublisher
from vramfabric.broker.codec import decode_one_of, encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import (
    ErrorKind,
    InvalidMessage,
    LeaseExpired,
    PermanentError,
    ResultAlreadyRecorded,
    ResultRefused,
    TransientError,
    VramfabricError,
    nats_errors,
)
from vramfabric.broker.messages import Chunk, ChunkResult, JobSpec
from vramfabric.broker.packs import ChunkPack, PackResult
from vramfabric.broker.retrying import CallRetry
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import HEADER_MSG_ID, MAX_PACK_CHUNKS, Subjects

from ..leases.ledger import SliceLedger
from ..node.metrics import WorkerMetrics
from .keepalive import KeepAlive, quiet
from .pack_runner import PackRunner
from .runner import ChunkRunner

log = logging.getLogger(__name__)


@attrs.define
class ChunkHandler:
    """Runs the chunks of one job and records their outcomes."""

    conn: Connection
    broker: BrokerSettings
    spec: JobSpec
    ledger: SliceLedger
    runner: ChunkRunner
    metrics: WorkerMetrics
    acks: AckedPublisher
    stopping: Callable[[], bool]
    keepalive: KeepAlive = attrs.field(init=False)
    _subjects: Subjects = attrs.field(init=False)
    # This tenant's series, looked up once rather than per chunk.
    _submits: Counter = attrs.field(init=False)
    _submit_s: Histogram = attrs.field(init=False)
    _publish_retry: CallRetry = attrs.field(init=False)
    _packs: PackRunner = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        """One keepalive for the job's running chunks; subject names and series bound once."""
        self.keepalive = KeepAlive(self.spec.ack_wait_s / 3)
        self._packs = PackRunner(self.runner)
        self._subjects = self.broker.subjects
        self._submits = self.metrics.submit_total.labels(tenant=self.spec.tenant)
        self._submit_s = self.metrics.submit_seconds.labels(tenant=self.spec.tenant)
        policy = self.broker.call_retry
        self._publish_retry = policy.within(max(self.spec.ack_wait_s, policy.deadline_s or 0.0))

    @property
    def job(self) -> str:
        """The job id."""
        return self.spec.job_id

    async def handle(self, msg: Msg, lease_id: str) -> None:
        """Run one chunk on `lease_id`; never raises (a chunk must not kill its puller).

        A chunk that started keeps its result even if its lease ends while it runs (the
        slot keeps the VRAM until then); a lease that has ended starts no chunk.
        """
        started_at = time.time()
        self._submits.inc()
        attempt = _delivery(msg)[0]
        self.keepalive.add(msg)
        try:
            await self._process(msg, lease_id, attempt, started_at)
        except Exception as exc:  # last resort: a chunk's bug must not end its puller
            log.error("chunk handling failed job=%s error=%s", self.job, exc, exc_info=exc)
        finally:
            self.keepalive.discard(msg)

    async def _process(self, msg: Msg, lease_id: str, attempt: int, started_at: float) -> None:
        try:
            chunk = decode_one_of((Chunk, ChunkPack), msg.data)
            if chunk.job != self.job:
                raise InvalidMessage("Chunk", f"job {chunk.job!r} on the consumer of {self.job!r}")
        except InvalidMessage as exc:
            await self._reject(msg, exc, attempt, lease_id, started_at)
            return
        first, last = (chunk.index, None) if isinstance(chunk, Chunk) else (chunk.first, chunk.last)
        result: ChunkResult | PackResult
        try:
            lease = self.ledger.get(lease_id)
            if lease is None or not self.ledger.is_live(lease_id, time.monotonic()):
                raise LeaseExpired(lease_id)
            if isinstance(chunk, Chunk):
                result = await self.runner.run(self.spec, chunk, lease, attempt)
            else:
                result = await self._packs.run(self.spec, chunk, lease, attempt)
            self._submit_s.observe(time.time() - started_at)
        except TransientError as exc:
            if attempt < self.spec.retry.max_deliver:
                log.warning(
                    "chunk retried job=%s index=%s attempt=%d error=%s",
                    self.job,
                    first,
                    attempt,
                    exc,
                )
                self._error(exc.kind.value)
                await quiet(msg.nak(delay=self.spec.retry.nak_delay_s(attempt)))
                return
            result = self._failed(first, last, exc, attempt, lease_id, started_at)
        except Exception as exc:  # recorded: the chunk (or each of the pack's) fails with it
            result = self._failed(first, last, exc, attempt, lease_id, started_at)
        await self._finish(msg, result)

    def _failed(
        self,
        first: int,
        last: int | None,
        exc: BaseException,
        attempt: int,
        lease_id: str,
        started_at: float,
    ) -> ChunkResult | PackResult:
        """The failed result of a chunk, or of every chunk of the pack `first`..`last`."""
        if last is None:
            return self.runner.failed(self.job, first, exc, attempt, lease_id, started_at)
        failed = tuple(
            self.runner.failed(self.job, i, exc, attempt, lease_id, started_at)
            for i in range(first, last + 1)
        )
        return PackResult(
            job=self.job,
            first=first,
            outputs=(None,) * len(failed),
            others=failed,
            attempt=attempt,
            node=self.runner.node,
            lease_id=lease_id,
            started_at=started_at,
            elapsed_s=time.time() - started_at,
        )

    async def _reject(
        self, msg: Msg, exc: InvalidMessage, attempt: int, lease_id: str, started_at: float
    ) -> None:
        self.metrics.invalid("work")
        chunks = _range_from(msg)
        if chunks is None:
            # No chunk index to record a result under: drop it, counted and logged.
            log.warning("undecodable chunk dropped job=%s error=%s", self.job, exc)
            await msg.term()
            return
        first, last = chunks
        await self._finish(
            msg,
            self._failed(
                first, None if last == first else last, exc, attempt, lease_id, started_at
            ),
        )

    async def _finish(self, msg: Msg, result: ChunkResult | PackResult) -> None:
        failed = _failures(result)
        for failure in failed:
            if failure.error_kind is not None:
                self._error(failure.error_kind.value)
        try:
            await self._publish_patiently(result, _delivery(msg)[1])
        except ResultAlreadyRecorded:
            self.metrics.results_duplicate_total.labels(tenant=self.spec.tenant).inc()
        except PermanentError as exc:
            # Retrying cannot store it: store a small failure naming why instead. If even that
            # is refused (this node may not publish there), another node may store the chunk's.
            first, last = _chunks(result)
            log.error("result refused job=%s index=%d error=%s", self.job, first, exc)
            if failed and all(f.error_kind is ErrorKind.RESULT_REFUSED for f in failed):
                await quiet(msg.nak(delay=self.spec.retry.nak_delay_s(result.attempt)))
                return
            r = result
            refused = self._failed(
                first, last, ResultRefused(exc), r.attempt, r.lease_id, r.started_at
            )
            await self._finish(msg, refused)
            return
        except VramfabricError as exc:
            # The result did not reach the stream: leave the chunk for redelivery.
            log.warning(
                "result publish failed job=%s index=%d error=%s", self.job, _chunks(result)[0], exc
            )
            await quiet(msg.nak(delay=self.spec.retry.nak_delay_s(result.attempt)))
            return
        # The result is stored before the work message is acked (at-least-once, nothing lost);
        # an ack lost to a blip only means a redelivery that finds the result stored.
        await quiet(msg.ack() if len(failed) < _size(result) else msg.term())
        if isinstance(result, ChunkResult):
            await self.runner.forget_checkpoint(self.spec.tenant, self.job, result.index)

    def _error(self, kind: str) -> None:
        self.metrics.submit_errors_total.labels(tenant=self.spec.tenant, kind=kind).inc()

    async def _publish_patiently(self, result: ChunkResult | PackResult, work_seq: int) -> None:
        # While the results stream elects a leader, keep the computed result and retry,
        # rather than nak and compute it again: the keepalive holds the chunk meanwhile.
        await self._publish_retry.call(
            lambda: self._publish(result, work_seq),
            what=f"publish result job={self.job} index={_chunks(result)[0]}",
            give_up=self.stopping,
        )

    async def _publish(self, result: ChunkResult | PackResult, work_seq: int) -> None:
        first, last = _chunks(result)
        subject = self._subjects.result(self.spec.tenant, self.job, first, last)
        msg_id = self._subjects.result_msg_id(self.job, first, work_seq, last)
        headers = {HEADER_MSG_ID: msg_id}
        with nats_errors():
            duplicate = await self.acks.publish(subject, encode(result), headers)
        if duplicate:
            raise ResultAlreadyRecorded(subject)


def _delivery(msg: Msg) -> tuple[int, int]:
    """(times delivered, stream sequence) of a work message."""
    delivery = Subjects.delivery_of(msg.reply)
    if delivery is None:  # a form we do not parse: nats-py reads it (or raises)
        return msg.metadata.num_delivered, msg.metadata.sequence.stream
    return delivery


def _range_from(msg: Msg) -> tuple[int, int] | None:
    """(first, last) chunk from the `Nats-Msg-Id` header, if it parses as a chunk or pack."""
    chunks = Subjects.chunk_range_of((msg.headers or {}).get(HEADER_MSG_ID, ""))
    if chunks is None or chunks[1] - chunks[0] >= MAX_PACK_CHUNKS:
        return None
    return chunks


def _chunks(result: ChunkResult | PackResult) -> tuple[int, int | None]:
    """(first chunk, last chunk of a pack or None) of a result."""
    if isinstance(result, ChunkResult):
        return result.index, None
    return result.first, result.last


def _failures(result: ChunkResult | PackResult) -> list[ChunkResult]:
    """The failed chunks of a result."""
    if isinstance(result, ChunkResult):
        return [] if result.ok else [result]
    return [r for r in result.others if not r.ok]


def _size(result: ChunkResult | PackResult) -> int:
    """How many chunks a result is for."""
    return 1 if isinstance(result, ChunkResult) else len(result.outputs)
