"""Follower: an ordered consumer that survives a server restart or a lost server.

nats-py's ordered consumer recovers from a lost consumer only through its heartbeat check,
which dies if the reset itself fails while the server is still down. A Follower instead
subscribes again, from the stream sequence after the last it saw, after every reconnect and
whenever a periodic check finds its consumer gone (its server died while ours lived).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import attrs
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import PermanentError, TransientError, from_nats, nats_errors
from vramfabric.broker.retrying import CallRetry
from vramfabric.broker.subjects import Subjects

log = logging.getLogger(__name__)

# Heartbeats let nats-py notice a silent consumer within two of them.
_IDLE_HEARTBEAT_S = 1.0
# How often the consumer's existence is checked.
_CHECK_EVERY_S = 1.0


@attrs.define
class Follower:
    """Delivers every message on `subject` of `stream` to `handler`, from the first on."""

    conn: Connection
    subject: str
    stream: str
    handler: Callable[[Msg], Awaitable[None]]
    # Its deadline is ignored: a follower resubscribes for as long as it runs.
    retry: CallRetry
    _next_seq: int = attrs.field(default=1, init=False)
    _sub: JetStreamContext.PushSubscription | None = attrs.field(default=None, init=False)
    _resubscribing: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    _watchdog: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    _running: bool = attrs.field(default=True, init=False)

    async def start(self) -> None:
        """Subscribe, and subscribe again after each reconnect or loss of the consumer."""
        await self._subscribe()
        self.conn.on_reconnect.append(self._on_reconnect)
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while self._running:
            await asyncio.sleep(_CHECK_EVERY_S)  # the check period itself
            sub = self._sub
            if sub is None or (self._resubscribing and not self._resubscribing.done()):
                continue
            try:
                await asyncio.wait_for(sub.consumer_info(), _CHECK_EVERY_S)
            except Exception as exc:
                log.info("follower consumer lost subject=%s error=%s", self.subject, from_nats(exc))
                self._on_reconnect()

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
            )

    async def _on_msg(self, msg: Msg) -> None:
        delivery = Subjects.delivery_of(msg.reply)
        seq = msg.metadata.sequence.stream if delivery is None else delivery[1]
        await self.handler(msg)
        # Only once handled: a resubscribe that cancels a handler mid-way (nats-py cancels
        # the callback with the subscription) must deliver that message again.
        self._next_seq = seq + 1

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
            except Exception as exc:
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
            self._resubscribing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resubscribing
        await self._unsubscribe()
