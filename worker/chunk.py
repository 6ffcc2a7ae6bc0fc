"""ChunkHandler: one chunk on one lease, from its message to its stored result and ack.

Order matters for at-least-once delivery with nothing lost: the result is stored (its
PubAck is back) before the work message is acked; a transient failure naks with the retry
policy's delay; a permanent one stores a failed result and terminates the message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import attrs
import nats.errors
from nats.aio.msg import Msg
from prometheus_client import Counter, Histogram

from vramfabric.broker.acked import AckedPublisher
from vramfabric.broker.codec import decode, encode
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
    from_nats,
    nats_errors,
)
from vramfabric.broker.messages import Chunk, ChunkResult, JobSpec
from vramfabric.broker.retrying import CallRetry
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import HEADER_MSG_ID, Subjects

from .ledger import SliceLedger
from .metrics import WorkerMetrics
from .slot import ChunkRunner

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

    def __attrs_post_init__(self) -> None:
        """One keepalive for the job's running chunks; subject names and series bound once."""
        self.keepalive = KeepAlive(self.spec.ack_wait_s / 3)
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
            chunk = decode(Chunk, msg.data)
            if chunk.job != self.job:
                raise InvalidMessage("Chunk", f"job {chunk.job!r} on the consumer of {self.job!r}")
        except InvalidMessage as exc:
            await self._reject(msg, exc, attempt, lease_id, started_at)
            return
        index = chunk.index
        try:
            lease = self.ledger.get(lease_id)
            if lease is None or not self.ledger.is_live(lease_id, time.monotonic()):
                raise LeaseExpired(lease_id)
            result = await self.runner.run(self.spec, chunk, lease, attempt)
            self._submit_s.observe(time.time() - started_at)
        except TransientError as exc:
            if attempt < self.spec.retry.max_deliver:
                log.warning(
                    "chunk retried job=%s index=%s attempt=%d error=%s",
                    self.job,
                    index,
                    attempt,
                    exc,
                )
                self._error(exc.kind.value)
                await quiet(msg.nak(delay=self.spec.retry.nak_delay_s(attempt)))
                return
            result = self.runner.failed(self.job, index, exc, attempt, lease_id, started_at)
        except Exception as exc:
            result = self.runner.failed(self.job, index, exc, attempt, lease_id, started_at)
        await self._finish(msg, result)

    async def _reject(
        self, msg: Msg, exc: InvalidMessage, attempt: int, lease_id: str, started_at: float
    ) -> None:
        self.metrics.invalid("work")
        index = _index_from(msg)
        if index is None:
            # No chunk index to record a result under: drop it, counted and logged.
            log.warning("undecodable chunk dropped job=%s error=%s", self.job, exc)
            await msg.term()
            return
        await self._finish(
            msg, self.runner.failed(self.job, index, exc, attempt, lease_id, started_at)
        )

    async def _finish(self, msg: Msg, result: ChunkResult) -> None:
        if result.error_kind is not None:
            self._error(result.error_kind.value)
        try:
            await self._publish_patiently(result, _delivery(msg)[1])
        except ResultAlreadyRecorded:
            self.metrics.results_duplicate_total.labels(tenant=self.spec.tenant).inc()
        except PermanentError as exc:
            # Retrying cannot store it: store a small failure naming why instead. If even that
            # is refused (this node may not publish there), another node may store the chunk's.
            log.error("result refused job=%s index=%d error=%s", self.job, result.index, exc)
            if result.error_kind is ErrorKind.RESULT_REFUSED:
                await quiet(msg.nak(delay=self.spec.retry.nak_delay_s(result.attempt)))
                return
            r = result
            failed = self.runner.failed(
                r.job, r.index, ResultRefused(exc), r.attempt, r.lease_id, r.started_at
            )
            await self._finish(msg, failed)
            return
        except VramfabricError as exc:
            # The result did not reach the stream: leave the chunk for redelivery.
            log.warning(
                "result publish failed job=%s index=%d error=%s", self.job, result.index, exc
            )
            await quiet(msg.nak(delay=self.spec.retry.nak_delay_s(result.attempt)))
            return
        # The result is stored before the work message is acked (at-least-once, nothing lost);
        # an ack lost to a blip only means a redelivery that finds the result stored.
        await quiet(msg.ack() if result.ok else msg.term())
        await self.runner.forget_checkpoint(self.spec.tenant, self.job, result.index)

    def _error(self, kind: str) -> None:
        self.metrics.submit_errors_total.labels(tenant=self.spec.tenant, kind=kind).inc()

    async def _publish_patiently(self, result: ChunkResult, work_seq: int) -> None:
        # While the results stream elects a leader, keep the computed result and retry,
        # rather than nak and compute it again: the keepalive holds the chunk meanwhile.
        await self._publish_retry.call(
            lambda: self._publish(result, work_seq),
            what=f"publish result job={self.job} index={result.index}",
            give_up=self.stopping,
        )

    async def _publish(self, result: ChunkResult, work_seq: int) -> None:
        subject = self._subjects.result(self.spec.tenant, self.job, result.index)
        msg_id = self._subjects.result_msg_id(self.job, result.index, work_seq)
        headers = {HEADER_MSG_ID: msg_id}
        with nats_errors():
            duplicate = await self.acks.publish(subject, encode(result), headers)
        if duplicate:
            raise ResultAlreadyRecorded(subject)


class KeepAlive:
    """Sends `in_progress()` for chunks running longer than `interval_s`, every `interval_s`.

    One timer for all the chunks of a job, armed while any runs: a chunk costs two dict
    operations, and short chunks never send anything. A chunk's ack wait is at least
    `3 * interval_s`; the longest gap between its in_progress calls is `2 * interval_s`.
    """

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        # Running chunks by id (messages are not hashable), each with the loop time it
        # started or last sent in_progress.
        self._running: dict[int, tuple[Msg, float]] = {}
        self._sending: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, msg: Msg) -> None:
        """Keep `msg` alive from now until `discard(msg)`."""
        loop = asyncio.get_running_loop()
        self._running[id(msg)] = (msg, loop.time())
        if self._timer is None:
            self._timer = loop.call_later(self._interval_s, self._tick)

    def discard(self, msg: Msg) -> None:
        """Stop keeping `msg` alive."""
        self._running.pop(id(msg), None)

    def _tick(self) -> None:
        self._timer = None
        if not self._running:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = now - self._interval_s
        for key, (msg, since) in self._running.items():
            if since <= due:
                self._running[key] = (msg, now)
                # Held until done: the loop keeps only weak references to tasks.
                sent = loop.create_task(quiet(msg.in_progress()))
                self._sending.add(sent)
                sent.add_done_callback(self._sending.discard)
        self._timer = loop.call_later(self._interval_s, self._tick)


async def quiet(coro: Any) -> None:
    """Await a best-effort ack call (ack, nak, term, in_progress), logging its failure."""
    try:
        await coro
    except (nats.errors.Error, TimeoutError) as exc:
        log.debug("ack call failed error=%s", from_nats(exc))


def _delivery(msg: Msg) -> tuple[int, int]:
    """(times delivered, stream sequence) of a work message."""
    delivery = Subjects.delivery_of(msg.reply)
    if delivery is None:  # a form we do not parse: nats-py reads it (or raises)
        return msg.metadata.num_delivered, msg.metadata.sequence.stream
    return delivery


def _index_from(msg: Msg) -> int | None:
    """The chunk index from the `Nats-Msg-Id` header, if it parses."""
    return Subjects.chunk_index_of((msg.headers or {}).get(HEADER_MSG_ID, ""))
