"""Keeping running chunks' messages alive, and best-effort ack calls on them.

A chunk's message must be acked, nak'ed or termed; a long chunk tells the server it is still
working (`in_progress`) so its ack wait does not pass. These calls are best effort: a lost
one costs a redelivery, which the stored result makes harmless.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from vramfabric.broker.errors import from_nats

log = logging.getLogger(__name__)


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
