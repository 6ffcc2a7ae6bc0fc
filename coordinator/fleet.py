"""FleetView: the latest advert of every live node, kept current by a KV watcher.

The view is advisory: the node's ledger is the truth, and a stale advert only costs a denial.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import attrs
from nats.js.kv import KeyValue

from vramfabric.broker import topology
from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, from_nats
from vramfabric.broker.messages import NodeAdvert
from vramfabric.broker.settings import BrokerSettings

log = logging.getLogger(__name__)

_GONE = ("DEL", "PURGE")


@attrs.define
class FleetView:
    """Node adverts by node name; `changed` is set whenever one arrives or vanishes."""

    conn: Connection
    broker: BrokerSettings
    adverts: dict[str, NodeAdvert] = attrs.field(factory=dict, init=False)
    changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    invalid: int = attrs.field(default=0, init=False)
    _task: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    _kv: KeyValue | None = attrs.field(default=None, init=False)
    _rewatching: asyncio.Task[None] | None = attrs.field(default=None, init=False)

    async def start(self) -> None:
        """Start watching and wait for the initial replay of current adverts."""
        self._kv = await topology.nodes_bucket(self.conn.js, self.broker)
        await self._rewatch()
        self.conn.on_reconnect.append(self._on_reconnect)

    async def _rewatch(self) -> None:
        # A new watcher replays the live adverts; until its replay ends, the old view stands.
        watcher = await self._kv.watchall()
        ready = asyncio.Event()
        old, self._task = (
            self._task,
            asyncio.get_running_loop().create_task(self._watch(watcher, ready)),
        )
        if old is not None:
            old.cancel()
        await ready.wait()

    def _on_reconnect(self) -> None:
        # A restarted server has forgotten the watcher's ephemeral consumer: watch again.
        self._rewatching = asyncio.get_running_loop().create_task(self._rewatch_until_done())

    async def _rewatch_until_done(self) -> None:
        while True:
            try:
                await self._rewatch()
                return
            except Exception as exc:
                log.warning("advert watch not restarted yet error=%s", from_nats(exc))
                await asyncio.sleep(0.5)  # retry pause while the server recovers

    async def _watch(self, watcher: KeyValue.KeyWatcher, ready: asyncio.Event) -> None:
        fresh: dict[str, NodeAdvert] = {}
        try:
            async for entry in watcher:
                if entry is None:  # end of the replay: it holds every live node
                    self.adverts = fresh
                    self.changed.set()
                    ready.set()
                    continue
                self._apply(fresh if not ready.is_set() else self.adverts, entry)
        finally:
            await watcher.stop()

    def _apply(self, adverts: dict[str, NodeAdvert], entry: KeyValue.Entry) -> None:
        key, value = entry.key, entry.value
        # A TTL limit marker arrives as PURGE with an empty value: the node stopped beating.
        if entry.operation in _GONE or not value:
            adverts.pop(key, None)
        else:
            try:
                adverts[key] = decode(NodeAdvert, value)
            except InvalidMessage as exc:
                self.invalid += 1
                log.warning("bad advert ignored key=%s error=%s", key, exc)
                return
        self.changed.set()

    async def wait_changed(self, timeout_s: float) -> bool:
        """Wait until an advert changes; True if one did within `timeout_s`."""
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def free_slices(self, slice_bytes: int) -> int:
        """Leases of `slice_bytes` the fleet advertises as free now."""
        return sum(a.free_slices(slice_bytes) for a in self.adverts.values())

    async def stop(self) -> None:
        """Stop watching."""
        if self._on_reconnect in self.conn.on_reconnect:
            self.conn.on_reconnect.remove(self._on_reconnect)
        if self._rewatching is not None:
            self._rewatching.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
