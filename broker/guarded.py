"""GuardedClient: a nats-py Client whose calls hear of a permission violation at once.

The server reports a permission violation only asynchronously (nats-py hands it to the
error callback, and the call that caused it would just time out). `GuardedClient` ties
each violation back to the request or subscribe on that subject, which then raises
PermissionDenied at once. It also refuses to send CONNECT to a server that must speak TLS
but did not ask for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any, cast

import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from . import tls
from .errors import PermissionDenied

log = logging.getLogger(__name__)

# nats-py lower-cases the server's message, subject included.
_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"')


class GuardedClient(Client):
    """A nats-py Client whose requests and subscribes raise PermissionDenied promptly.

    Each request and subscribe registers its subject while it waits; a violation the
    server reports for that subject fails the call. A subscribe waits one round trip (a
    flush) for the server's verdict when `guard` is on (an authenticated connection).
    """

    def __init__(self, guard: bool, flush_timeout_s: float, require_tls: bool = False) -> None:
        super().__init__()
        self.guard = guard
        self._flush_timeout_s = flush_timeout_s
        self._require_tls = require_tls
        self._waiting: dict[str, set[asyncio.Future[None]]] = {}

    def _connect_command(self) -> bytes:
        """nats-py's CONNECT line, refused to a server that must speak TLS but did not ask.

        nats-py upgrades only when the server asks, even for a tls:// URL, so a server (or a
        machine in the middle) that does not would get the credentials in clear. CONNECT is
        built after the upgrade, on every (re)connect: refusing here sends nothing.
        """
        if self._require_tls and not self._server_info.get("tls_required"):
            raise nats.errors.Error(f"nats: {tls.NOT_OFFERED}")
        return super()._connect_command()

    def violation(self, message: str) -> bool:
        """Fail the calls waiting on the subject a violation names; True if any was."""
        match = _VIOLATION.search(message)
        if match is None:
            return False
        op, subject = match.groups()
        failed = False
        for waiter in self._waiting.pop(subject, ()):
            if not waiter.done():
                waiter.set_exception(
                    PermissionDenied(f"the server refused {op} to {subject!r} for this user")
                )
                failed = True
        return failed

    @contextlib.contextmanager
    def watch(self, subject: str) -> Iterator[asyncio.Future[None]]:
        """A future that fails with PermissionDenied if the server refuses `subject` meanwhile."""
        key = subject.lower()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._waiting.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiting[key]
            if waiter.done() and not waiter.cancelled():
                waiter.exception()  # retrieved: no "never retrieved" warning
            waiter.cancel()

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float = 0.5,
        old_style: bool = False,
        headers: dict[str, Any] | None = None,
    ) -> Any:
        """Client.request, failing with PermissionDenied as soon as the server refuses it."""
        if not self.guard:
            return await super().request(subject, payload, timeout, old_style, headers)
        with self.watch(subject) as denied:
            call = asyncio.ensure_future(
                super().request(subject, payload, timeout, old_style, headers)
            )
            try:
                await asyncio.wait((call, denied), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                call.cancel()
                raise
            if call.done():
                return call.result()
            call.cancel()
            # Waited for, not awaited: its CancelledError is not this caller's cancellation.
            await asyncio.wait({call})
            raise cast(PermissionDenied, denied.exception())

    async def subscribe(self, subject: str, *args: Any, **kwargs: Any) -> Subscription:
        """Client.subscribe; on a guarded connection, PermissionDenied if the server refuses."""
        if not self.guard:
            return await super().subscribe(subject, *args, **kwargs)
        with self.watch(subject) as denied:
            sub = await super().subscribe(subject, *args, **kwargs)
            try:
                # nats-py writes a PING straight to the socket, ahead of commands still
                # buffered: write the SUB out first, so the server's verdict on it comes
                # before the PONG.
                await self._flush_pending(force_flush=True)
                await self.flush(self._flush_timeout_s)  # type: ignore[arg-type]
            except nats.errors.Error as exc:
                log.debug("subscribe flush failed subject=%s error=%s", subject, exc)
            if denied.done():
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()
                raise cast(PermissionDenied, denied.exception())
        return sub
