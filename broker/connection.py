"""connect(settings) -> Connection: one NATS client and its JetStream context, with logging.

The server reports a permission violation only asynchronously (nats-py hands it to the
error callback, and the call that caused it would just time out). `GuardedClient` ties
each violation back to the request or subscribe on that subject, which then raises
PermissionDenied at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any, cast

import attrs
import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from . import tls
from .errors import Disconnected, PermanentError, PermissionDenied, TransientError, from_nats
from .probe import not_nats
from .settings import BrokerSettings
from .subjects import JS_API, Subjects

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


@attrs.define
class Connection:
    """A connected NATS client plus its JetStream context; `errors` counts async errors."""

    nc: Client
    js: JetStreamContext
    settings: BrokerSettings = attrs.field(factory=BrokerSettings)
    errors: list[str] = attrs.field(factory=list)
    # Called after every reconnect: subscriptions that live on server state (pull requests,
    # ephemeral consumers) must be renewed, since a restarted server has forgotten them.
    on_reconnect: list[Callable[[], None]] = attrs.field(factory=list)
    _prefixed: dict[str, JetStreamContext] = attrs.field(factory=dict, init=False)

    @property
    def fleet_js(self) -> JetStreamContext:
        """JetStream for the fleet's adverts bucket (through an import in a tenant's account)."""
        return self._with_prefix(self.settings.fleet_api)

    def tenant_js(self, tenant: str) -> JetStreamContext:
        """JetStream for one tenant's streams and stores, as the workers reach them.

        With auth on, the workers' account reaches a tenant's account only through the calls
        that account exports, imported under `Subjects.tenant_api`; without auth every
        tenant's streams are in this connection's own account.
        """
        return self._with_prefix(self.settings.tenant_api(tenant))

    def _with_prefix(self, prefix: str) -> JetStreamContext:
        if prefix == JS_API:
            return self.js
        js = self._prefixed.get(prefix)
        if js is None:
            js = self._prefixed[prefix] = self.nc.jetstream(
                prefix=prefix, timeout=self.settings.request_timeout_s
            )
        return js

    async def close(self) -> None:
        """Flush and close the connection; safe to call twice."""
        if not self.nc.is_closed:
            await self.nc.drain() if self.nc.is_connected else await self.nc.close()


async def connect(settings: BrokerSettings, *, name: str = "vramfabric") -> Connection:
    """Connect to the servers in `settings`, reconnecting forever once connected.

    Raises:
        Disconnected: no server answered within the connect timeout.
    """
    errors: list[str] = []
    connected = asyncio.Event()  # set once the first connect succeeds

    async def on_error(exc: Exception) -> None:
        # Permission violations arrive only here; the guard hands them to the waiting call.
        msg = f"{type(exc).__name__}: {exc}"
        if nc.violation(str(exc)):
            # Raised from the call that caused it, which decides how bad it is.
            log.debug("permission violation name=%s error=%s", name, msg)
            return
        if len(errors) < 1000:
            errors.append(msg)
        # Before the first connect succeeds, its failure (raised below) says what went wrong.
        log.log(
            logging.WARNING if connected.is_set() else logging.DEBUG,
            "nats error name=%s error=%s",
            name,
            msg,
        )

    async def on_disconnect() -> None:
        log.info("nats disconnected name=%s", name)

    listeners: list[Callable[[], None]] = []

    async def on_reconnect() -> None:
        log.info("nats reconnected name=%s url=%s", name, nc.connected_url)
        for listener in list(listeners):
            listener()

    options: dict[str, Any] = {
        "servers": settings.servers,
        "name": name,
        "connect_timeout": settings.connect_timeout_s,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.25,
        "ping_interval": 10,
        "allow_reconnect": True,
        "error_cb": on_error,
        "disconnected_cb": on_disconnect,
        "reconnected_cb": on_reconnect,
    }
    options.update(_credentials(settings))
    # nats-py takes None as "not given": its own default context for a tls:// URL.
    options.update(tls=settings.tls, tls_hostname=settings.tls_hostname)
    tls.quiet_closing_noise()  # any server may ask for TLS, even for a nats:// URL
    nc = GuardedClient(settings.authenticated, settings.request_timeout_s, settings.tls_required)
    try:
        # The first connect retries until the deadline, then fails rather than hang forever.
        await asyncio.wait_for(nc.connect(**options), settings.connect_timeout_s)
    except Exception as exc:  # re-raised, as what the failure was (refused, unreachable, bug)
        await nc.close()
        if _refused(exc, nc):
            who = settings.user or settings.creds_file or settings.nkey_seed_file
            raise PermissionDenied(
                f"NATS at {settings.url} refused the credentials of {who or 'an anonymous client'}"
            ) from exc
        err = await _connect_error(settings, exc, errors)
        if err is exc:
            raise  # not a NATS failure (a bug): surface it unchanged
        raise err from exc
    connected.set()
    js = nc.jetstream(timeout=settings.request_timeout_s, publish_async_max_pending=1024)
    return Connection(nc=nc, js=js, settings=settings, errors=errors, on_reconnect=listeners)


def _refused(exc: BaseException, nc: Client) -> bool:
    """Whether a failed connect was the server refusing who we are, not a lost network."""
    seen = [exc, exc.__cause__, getattr(nc, "last_error", None)]
    return any(
        isinstance(e, nats.errors.AuthorizationError) or "authorization" in str(e).lower()
        for e in seen
        if e is not None
    )


def _credentials(settings: BrokerSettings) -> dict[str, Any]:
    """Connect options that say who we are, and the inbox prefix that goes with it."""
    options: dict[str, Any] = {}
    if settings.user:
        # Each user reads replies only under its own prefix (the server enforces it). With
        # an nkey, the user names only the prefix: the nkey is who we are.
        options["inbox_prefix"] = Subjects.inbox_prefix(settings.user)
        if not settings.nkey_seed_file:
            options.update(user=settings.user, password=settings.password)
    if settings.nkey_seed_file:
        options["nkeys_seed"] = settings.nkey_seed_file
    if settings.creds_file:
        options["user_credentials"] = settings.creds_file
    return options


async def _connect_error(
    settings: BrokerSettings, exc: Exception, errors: list[str]
) -> BaseException:
    """What a failed first connect raises: Disconnected for a blip, else the mapped error.

    The connect deadline ends in a timeout; the errors seen on the way say why (the last one
    names the cause when nothing listens at the address, or the host name is unknown). With
    no error seen, something accepted the connection: a look at what it sends tells a slow
    NATS server from another service.
    """
    err = from_nats(exc)
    if not isinstance(err, TransientError):
        return err
    if why := tls.failure(errors, ca_given=settings.tls is not None):
        return PermanentError(f"TLS with NATS at {settings.url} refused: {why}")
    last = errors[-1] if errors else ""
    if last.startswith("ConnectionRefusedError"):
        why = "connection refused (no server listens there)"
    elif last.startswith("gaierror"):
        why = "host name not found (check the host in VRAMFABRIC_NATS_URL)"
    else:
        why = await not_nats(settings.servers[0]) or str(err)
    return Disconnected(f"cannot reach NATS at {settings.url}: {why}")
