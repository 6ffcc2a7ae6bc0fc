"""Follower: an ordered consumer that survives a server restart, a lost server and a stall.

nats-py's ordered consumer recovers from a lost consumer only through its heartbeat check,
which dies if the reset itself fails while the server is still down. A Follower instead
subscribes again, from the stream sequence after the last it handled, after every reconnect,
whenever its consumer is gone, when nats-py dropped messages (a callback that fell behind
past the subscription's pending limits: nats-py then skips them silently), and when the
consumer has messages for it but none arrive (a stalled consumer). A follower that stays
stalled through several resubscribes fails with `FollowerStalled` rather than hang.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import attrs
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import (
    PermanentError,
    TransientError,
    VramfabricError,
    from_nats,
    nats_errors,
)
from vramfabric.broker.retrying import CallRetry
from vramfabric.broker.stopping import stop_task

log = logging.getLogger(__name__)

# Heartbeats let nats-py notice a silent consumer within two of them.
_IDLE_HEARTBEAT_S = 1.0
# Messages (and bytes) nats-py may buffer for the callback; past them it drops messages, which
# the follower notices by the gap in consumer sequences. Bounds the follower's memory.
PENDING_MSGS_LIMIT = 65_536
PENDING_BYTES_LIMIT = 64 * 2**20
# Resubscribes in a row without a message handled before the follower gives up.
MAX_STALLS = 3
# The longest a quiet follower goes without asking the server whether messages wait for it.
MAX_QUIET_CHECK_S = 120.0


class FollowerStalled(VramfabricError):
    """A follower's consumer had messages for it, yet none arrived through several resubscribes."""


@attrs.define
class Follower:
    """Delivers every message on `subject` of `stream` to `handler`, from the first on."""

    conn: Connection
    subject: str
    stream: str
    handler: Callable[[Msg], Awaitable[None]]
    # Its deadline bounds the first subscribe; a follower resubscribes for as long as it runs.
    retry: CallRetry
    # No message handled for this long while the consumer has some pending is a stall.
    stall_s: float = 10.0
    # A message being handled is progress for this long (a large output downloading, whose
    # reads have deadlines of their own); past it, the handler counts as stuck.
    handle_limit_s: float = 300.0
    # Called once with FollowerStalled when the follower gives up.
    on_fail: Callable[[FollowerStalled], None] | None = None
    stalls: int = attrs.field(default=0, init=False)
    handled: int = attrs.field(default=0, init=False)
    _next_seq: int = attrs.field(default=1, init=False)
    _consumer_seq: int = attrs.field(default=0, init=False)
    # The consumer sequence of the last message handled, and whether one is being handled.
    _handled_seq: int = attrs.field(default=0, init=False)
    _busy_since: float | None = attrs.field(default=None, init=False)
    _sub: JetStreamContext.PushSubscription | None = attrs.field(default=None, init=False)
    _resubscribing: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    _watchdog: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    _running: bool = attrs.field(default=True, init=False)

    async def start(self) -> None:
        """Subscribe, and subscribe again after each reconnect or loss of the consumer.

        Raises:
            TransientError: the subscription could not be made within the retry's deadline.
        """
        # A JetStream API request can time out on a busy server (seen under CI's load): the
        # first subscribe is retried like every later one, within the retry's deadline.
        await self.retry.call(self._subscribe, what=f"subscribe {self.subject}")
        self.conn.on_reconnect.append(self._on_reconnect)
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Resubscribe when the consumer is gone or stalled; give up after MAX_STALLS."""
        # Progress is judged by messages handled, not by a quick consumer_info: under load its
        # reply queues behind thousands of deliveries, and a short timeout read as "consumer
        # lost" made the follower throw its buffer away and start over again and again.
        # A quiet follower asks the server once per `check_s`, doubling it up to
        # MAX_QUIET_CHECK_S while nothing is pending: an idle job (chunks that run for
        # minutes) costs next to no API calls, and one with messages stuck is still seen.
        seen, quiet_s, period_s = self.handled, 0.0, min(1.0, self.stall_s / 2)
        check_s = self.stall_s
        while self._running:
            await asyncio.sleep(period_s)  # the check period itself
            if self.handled != seen:
                seen, quiet_s, self.stalls, check_s = self.handled, 0.0, 0, self.stall_s
                continue
            if self._sub is None or self._handling():
                quiet_s = 0.0  # not quiet: resubscribing, or a message being handled
                continue
            if self._resubscribing and not self._resubscribing.done():
                continue
            quiet_s += period_s
            if quiet_s < check_s:
                continue
            quiet_s = 0.0
            if not await self._stalled():
                check_s = min(check_s * 2, max(MAX_QUIET_CHECK_S, self.stall_s))
                continue
            check_s = self.stall_s
            self.stalls += 1
            if self.stalls > MAX_STALLS:
                self._fail()
                return
            self._on_reconnect()

    def _handling(self) -> bool:
        """Whether a message is being handled, within `handle_limit_s`."""
        since = self._busy_since
        return since is not None and time.monotonic() - since < self.handle_limit_s

    async def _stalled(self) -> bool:
        """Whether the consumer is gone, or has messages pending that do not come."""
        sub = self._sub
        if sub is None:
            return False
        try:
            info = await asyncio.wait_for(sub.consumer_info(), self.stall_s)
        except Exception as exc:  # any failure to ask is recorded as a lost consumer
            log.info("follower consumer lost subject=%s error=%s", self.subject, from_nats(exc))
            return True
        # Messages on the server for us, or delivered to us but never handled (dropped, or
        # lost in a reset). Judged by this consumer's own sequence: its stream position moves
        # past other jobs' results in the stream with nothing delivered (a filtered consumer).
        delivered = (info.delivered.consumer_seq or 0) if info.delivered else 0
        waiting = bool(info.num_pending) or delivered > self._handled_seq
        if waiting:
            log.warning(
                "follower stalled subject=%s pending=%s handled=%d quiet_s=%.0f",
                self.subject,
                info.num_pending,
                self.handled,
                self.stall_s,
            )
            return True
        return False

    def _fail(self) -> None:
        exc = FollowerStalled(
            f"results of {self.subject} stopped arriving: {self.stalls - 1} resubscribes "
            f"brought none in {self.stall_s:.0f} s each (handled {self.handled}, next stream "
            f"sequence {self._next_seq})"
        )
        log.error("follower gave up subject=%s error=%s", self.subject, exc)
        if self.on_fail is not None:
            self.on_fail(exc)

    async def _subscribe(self) -> None:
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self._next_seq
        )
        with nats_errors():
            self._sub = await self.conn.js.subscribe(
                self.subject,
                stream=self.stream,
                ordered_consumer=True,
                config=config,
                idle_heartbeat=_IDLE_HEARTBEAT_S,
                cb=self._on_msg,
                pending_msgs_limit=PENDING_MSGS_LIMIT,
                pending_bytes_limit=PENDING_BYTES_LIMIT,
            )
        self._consumer_seq = self._handled_seq = 0

    async def _on_msg(self, msg: Msg) -> None:
        stream_seq, consumer_seq = _sequences(msg)
        if stream_seq < self._next_seq:
            return  # handled already (a resubscribe replays from the first unhandled)
        if consumer_seq not in (1, self._consumer_seq + 1):
            # nats-py dropped messages in between (its pending limits) and moved on without
            # resetting the consumer: start again from the first message not handled.
            log.warning(
                "follower lost messages subject=%s expected=%d got=%d",
                self.subject,
                self._consumer_seq + 1,
                consumer_seq,
            )
            self._on_reconnect()
            return
        self._consumer_seq = consumer_seq
        self._busy_since = time.monotonic()
        try:
            await self.handler(msg)
        finally:
            self._busy_since = None
        # Only once handled: a resubscribe that cancels a handler mid-way (nats-py cancels
        # the callback with the subscription) must deliver that message again.
        self._next_seq = stream_seq + 1
        self._handled_seq = consumer_seq
        self.handled += 1

    def _on_reconnect(self) -> None:
        if self._resubscribing is None or self._resubscribing.done():
            self._resubscribing = asyncio.get_running_loop().create_task(self._resubscribe())

    async def _resubscribe(self) -> None:
        await self._unsubscribe()
        # No deadline: the stream may be electing a leader or its server restarting, and
        # a follower that gave up would miss every later message.
        try:
            await self.retry.within(None).call(
                self._subscribe,
                what=f"resubscribe {self.subject}",
                give_up=lambda: not self._running,
            )
        except TransientError:
            return  # stopped meanwhile
        except PermanentError as exc:
            # Refused for good (a permission or a deleted stream): retrying cannot help.
            log.error("follower cannot resubscribe subject=%s error=%s", self.subject, exc)
            return
        log.info("follower resubscribed subject=%s from_seq=%d", self.subject, self._next_seq)

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # logged: a closed or lost connection has nothing to undo
                log.debug("unsubscribe failed subject=%s error=%s", self.subject, from_nats(exc))

    async def stop(self) -> None:
        """Stop following."""
        self._running = False
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._on_reconnect in self.conn.on_reconnect:
            self.conn.on_reconnect.remove(self._on_reconnect)
        if self._resubscribing is not None:
            # Awaited: a resubscribe finishing after this would leave a live subscription.
            await stop_task(self._resubscribing)
        await self._unsubscribe()


def _sequences(msg: Msg) -> tuple[int, int]:
    """(stream sequence, consumer sequence) of a pushed message, from its ack subject."""
    # `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>` (9 tokens), or
    # 11 or 12 with a domain and an account hash before the stream (as Subjects.delivery_of).
    # Parsed here rather than through `msg.metadata`, which builds dataclasses per message.
    parts = msg.reply.split(".") if msg.reply else []
    at = 5 if len(parts) == 9 else 7
    if len(parts) in (9, 11, 12) and parts[at].isdigit() and parts[at + 1].isdigit():
        return int(parts[at]), int(parts[at + 1])
    meta = msg.metadata.sequence
    return meta.stream, meta.consumer
