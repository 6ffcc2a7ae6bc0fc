"""connect(settings) -> Connection: one NATS client and its JetStream context, with logging.

The client is a GuardedClient (guarded.py): a call the server refuses for this user raises
PermissionDenied at once. A first connect that fails says why in one error: refused
credentials, TLS, nothing listening, an unknown host, or something that is not NATS.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import attrs
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from . import tls
from .errors import Disconnected, PermanentError, PermissionDenied, TransientError, from_nats
from .guarded import GuardedClient
from .probe import not_nats
from .settings import BrokerSettings
from .stopping import stop_task
from .subjects import JS_API, Subjects

log = logging.getLogger(__name__)


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
        PermissionDenied: the server refused our credentials.
        PermanentError: TLS was refused (a handshake, a CA, a server that does not ask).
    """
    events = _Events(name)
    options = _options(settings, name, events)
    tls.quiet_closing_noise()  # any server may ask for TLS, even for a nats:// URL
    nc = events.nc = GuardedClient(
        settings.authenticated, settings.request_timeout_s, settings.tls_required
    )
    try:
        # The first connect retries until the deadline, then fails rather than hang forever.
        await _connect_within(nc, options, settings.connect_timeout_s)
    except Exception as exc:  # re-raised, as what the failure was (refused, unreachable, bug)
        await nc.close()
        err = await _first_connect_error(settings, exc, nc, events.errors)
        if err is exc:
            raise  # not a NATS failure (a bug): surface it unchanged
        raise err from exc
    events.connected = True
    js = nc.jetstream(timeout=settings.request_timeout_s, publish_async_max_pending=1024)
    return Connection(
        nc=nc, js=js, settings=settings, errors=events.errors, on_reconnect=events.listeners
    )


async def _connect_within(nc: Client, options: dict[str, Any], timeout_s: float) -> None:
    """`nc.connect(**options)`, ended at `timeout_s` with TimeoutError even if it eats a cancel.

    nats-py's first connect tries the servers again and again (reconnecting forever), so only
    a cancel ends it, and one can be lost: asyncio.wait_for on Python 3.11 returns the inner
    result instead of raising when a cancel lands as the future it waits on completes (here a
    refused TCP connect), and nats-py then tries the next server. `asyncio.wait_for` around
    the connect then waited for ever: a worker started before its server never logged a
    retry (a CI run on a busy machine). `stop_task` cancels until the connect has ended.
    """
    connecting = asyncio.ensure_future(nc.connect(**options))
    try:
        await asyncio.wait({connecting}, timeout=timeout_s)
    finally:  # also when we are cancelled: the connect must not run on without us
        if not connecting.done():
            await stop_task(connecting)
    if connecting.cancelled():
        raise TimeoutError(f"no NATS connection within {timeout_s}s")
    connecting.result()  # its error, if it failed first


@attrs.define
class _Events:
    """nats-py's callbacks for one connection: errors kept and logged, reconnects announced."""

    name: str
    errors: list[str] = attrs.field(factory=list)
    # Called after every reconnect (Connection.on_reconnect).
    listeners: list[Callable[[], None]] = attrs.field(factory=list)
    connected: bool = False  # set once the first connect succeeds
    nc: GuardedClient | None = None

    async def on_error(self, exc: Exception) -> None:
        """Hand a permission violation to the call waiting on it; keep and log the rest."""
        msg = f"{type(exc).__name__}: {exc}"
        if self.nc is not None and self.nc.violation(str(exc)):
            # Raised from the call that caused it, which decides how bad it is.
            log.debug("permission violation name=%s error=%s", self.name, msg)
            return
        if len(self.errors) < 1000:
            self.errors.append(msg)
        # Before the first connect succeeds, its failure (raised by connect) says what went
        # wrong.
        log.log(
            logging.WARNING if self.connected else logging.DEBUG,
            "nats error name=%s error=%s",
            self.name,
            msg,
        )

    async def on_disconnect(self) -> None:
        """Log the disconnect (nats-py reconnects by itself)."""
        log.info("nats disconnected name=%s", self.name)

    async def on_reconnect(self) -> None:
        """Log the reconnect and call every listener."""
        url = self.nc.connected_url if self.nc is not None else None
        log.info("nats reconnected name=%s url=%s", self.name, url)
        for listener in list(self.listeners):
            listener()


def _options(settings: BrokerSettings, name: str, events: _Events) -> dict[str, Any]:
    """nats-py's connect options: servers, reconnecting forever, callbacks, credentials, TLS."""
    options: dict[str, Any] = {
        "servers": settings.servers,
        "name": name,
        "connect_timeout": settings.connect_timeout_s,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.25,
        "ping_interval": 10,
        "allow_reconnect": True,
        "error_cb": events.on_error,
        "disconnected_cb": events.on_disconnect,
        "reconnected_cb": events.on_reconnect,
    }
    options.update(_credentials(settings))
    # nats-py takes None as "not given": its own default context for a tls:// URL.
    options.update(tls=settings.tls, tls_hostname=settings.tls_hostname)
    return options


async def _first_connect_error(
    settings: BrokerSettings, exc: Exception, nc: Client, errors: list[str]
) -> BaseException:
    """What a failed first connect raises: refused credentials, else `_connect_error`'s."""
    if _refused(exc, nc):
        who = settings.user or settings.creds_file or settings.nkey_seed_file
        return PermissionDenied(
            f"NATS at {settings.url} refused the credentials of {who or 'an anonymous client'}"
        )
    return await _connect_error(settings, exc, errors)


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
