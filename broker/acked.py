"""AckedPublisher: JetStream publishes whose PubAcks come back on one subscription.

nats-py's `js.publish` costs a request each (a reply future, a random token, a timer) and
`js.publish_async` never resolves a rejected publish (NATS_GUIDE.md, nats.py #985). Here
every publish carries a reply subject under one inbox of our own; the PubAck (or the
stream's error) resolves its future, and one timer sweeps the publishes whose PubAck is
overdue. Futures end with the same nats-py exceptions `js.publish` raises, for `from_nats`,
or with PermissionDenied as soon as the server refuses a publish (on a guarded connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging

import attrs
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from .errors import from_nats
from .guarded import GuardedClient

log = logging.getLogger(__name__)

_STATUS = "Status"
_NO_RESPONDERS = "503"


@attrs.frozen
class Stored:
    """A stream's acknowledgement of one publish: where the message is, and if it was a repeat.

    For a duplicate (its `Nats-Msg-Id` seen inside the dedup window) `seq` is the first
    message's sequence, which may since have been consumed or purged.
    """

    seq: int
    duplicate: bool


@attrs.define
class AckedPublisher:
    """Publishes to streams and hands back a future of each publish's acknowledgement."""

    nc: Client
    timeout_s: float
    _prefix: str = attrs.field(default="", init=False)
    _sub: Subscription | None = attrs.field(default=None, init=False)
    _ids: itertools.count[int] = attrs.field(factory=itertools.count, init=False)
    # Reply token -> (future, loop time its PubAck is due by). All publishes share one
    # timeout, so insertion order is deadline order: the sweep looks at the oldest only.
    _pending: dict[str, tuple[asyncio.Future[Stored], float]] = attrs.field(
        factory=dict, init=False
    )
    _sweep: asyncio.TimerHandle | None = attrs.field(default=None, init=False)

    async def start(self) -> AckedPublisher:
        """Subscribe to the reply inbox (a reconnect resubscribes it)."""
        self._prefix = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(f"{self._prefix}.*", cb=self._on_ack)
        return self

    async def stop(self) -> None:
        """Unsubscribe; publishes still waiting fail as timed out."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for future, _due in self._pending.values():
            if not future.done():
                future.set_exception(nats.errors.TimeoutError())
                # Marked as seen: a submission torn down (a map left early) never awaits it,
                # and asyncio would log "Future exception was never retrieved" for each.
                future.exception()
        self._pending.clear()
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except nats.errors.Error as exc:  # a closed or lost connection: nothing to undo
                log.debug("unsubscribe failed error=%s", from_nats(exc))

    async def submit(
        self, subject: str, payload: bytes, headers: dict[str, str] | None = None
    ) -> asyncio.Future[Stored]:
        """Publish; the future gives the stream's acknowledgement.

        The future fails with nats-py's exceptions: the stream's APIError, NoRespondersError
        when no stream listens, TimeoutError when no PubAck came within `timeout_s`; or with
        PermissionDenied when the server refuses this user the subject.
        Raises the publish's own error (not connected, payload too large, say) at once.
        """
        token = str(next(self._ids))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Stored] = loop.create_future()
        self._pending[token] = (future, loop.time() + self.timeout_s)
        if self._sweep is None:
            self._sweep = loop.call_later(self.timeout_s / 4, self._expire)
        if isinstance(self.nc, GuardedClient) and self.nc.guard:
            self._guard(self.nc, subject, token, future)
        try:
            await self.nc.publish(
                subject, payload, reply=f"{self._prefix}.{token}", headers=headers
            )
        except BaseException:  # re-raised: the publish never left, so no ack is awaited
            self._pending.pop(token, None)
            future.cancel()  # no one will await it; this also ends its guard
            raise
        return future

    def _guard(
        self, nc: GuardedClient, subject: str, token: str, future: asyncio.Future[Stored]
    ) -> None:
        """Fail the publish with PermissionDenied as soon as the server refuses its subject.

        A refused publish gets no PubAck, only an asynchronous error that the connection's
        guard ties to the subject; without this it would wait out `timeout_s` and read as
        a transient timeout.
        """
        watch = contextlib.ExitStack()
        denied = watch.enter_context(nc.watch(subject))

        def deny(waiter: asyncio.Future[None]) -> None:
            error = None if waiter.cancelled() else waiter.exception()
            if error is not None and self._pending.pop(token, None) is not None:
                future.set_exception(error)

        denied.add_done_callback(deny)
        future.add_done_callback(lambda _f: watch.close())

    async def publish(
        self, subject: str, payload: bytes, headers: dict[str, str] | None = None
    ) -> bool:
        """Publish and wait for the PubAck; True if the stream took it for a duplicate."""
        return (await (await self.submit(subject, payload, headers))).duplicate

    async def _on_ack(self, msg: Msg) -> None:
        entry = self._pending.pop(msg.subject[len(self._prefix) + 1 :], None)
        if entry is None or entry[0].done():
            return  # timed out already, or not ours
        future = entry[0]
        if msg.headers and msg.headers.get(_STATUS) == _NO_RESPONDERS:
            future.set_exception(nats.errors.NoRespondersError())
            return
        try:
            reply = json.loads(msg.data)
            if "error" in reply:
                # It raises the error rather than return it (the cause of nats.py #985).
                nats.js.errors.APIError.from_error(reply["error"])
            future.set_result(Stored(int(reply.get("seq") or 0), bool(reply.get("duplicate"))))
        except nats.js.errors.APIError as exc:
            future.set_exception(exc)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            future.set_exception(nats.errors.Error(f"unreadable PubAck: {exc}"))

    def _expire(self) -> None:
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._pending:
            token, (future, due) = next(iter(self._pending.items()))
            if due > now:
                break
            del self._pending[token]
            if not future.done():
                future.set_exception(nats.errors.TimeoutError())
        if self._pending:
            self._sweep = loop.call_later(self.timeout_s / 4, self._expire)
