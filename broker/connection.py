"""connect(settings) -> Connection: one NATS client and its JetStream context, with logging."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import attrs
from nats.aio.client import Client
from nats.js import JetStreamContext

from .errors import Disconnected, TransientError, from_nats
from .settings import BrokerSettings

log = logging.getLogger(__name__)


@attrs.define
class Connection:
    """A connected NATS client plus its JetStream context; `errors` counts async errors."""

    nc: Client
    js: JetStreamContext
    errors: list[str] = attrs.field(factory=list)
    # Called after every reconnect: subscriptions that live on server state (pull requests,
    # ephemeral consumers) must be renewed, since a restarted server has forgotten them.
    on_reconnect: list[Callable[[], None]] = attrs.field(factory=list)

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

    async def on_error(exc: Exception) -> None:
        # Permission violations arrive only here, never from the call that caused them.
        msg = f"{type(exc).__name__}: {exc}"
        if len(errors) < 1000:
            errors.append(msg)
        log.warning("nats error name=%s error=%s", name, msg)

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
    if settings.user:
        options.update(user=settings.user, password=settings.password)
    if settings.creds_file:
        options["user_credentials"] = settings.creds_file
    nc = Client()
    try:
        # The first connect retries until the deadline, then fails rather than hang forever.
        await asyncio.wait_for(nc.connect(**options), settings.connect_timeout_s)
    except Exception as exc:
        await nc.close()
        err = _connect_error(settings, exc)
        if err is exc:
            raise  # not a NATS failure (a bug): surface it unchanged
        raise err from exc
    js = nc.jetstream(timeout=settings.request_timeout_s, publish_async_max_pending=1024)
    return Connection(nc=nc, js=js, errors=errors, on_reconnect=listeners)


def _connect_error(settings: BrokerSettings, exc: Exception) -> BaseException:
    """What a failed first connect raises: Disconnected for a blip, else the mapped error."""
    err = from_nats(exc)
    if isinstance(err, TransientError):
        return Disconnected(f"cannot reach NATS at {settings.url}: {err}")
    return err
