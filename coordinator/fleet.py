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
from vramfabric.broker.errors import InvalidMessage
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
    _ready: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)

    async def start(self) -> None:
        """Start watching and wait for the initial replay of current adverts."""
        kv = await topology.nodes_bucket(self.conn.js, self.broker)
        watcher = await kv.watchall()
        self._task = asyncio.get_running_loop().create_task(self._watch(watcher))
        await self._ready.wait()

    async def _watch(self, watcher: KeyValue.KeyWatcher) -> None:
        try:
            async for entry in watcher:
                if entry is None:  # end of the initial replay
                    self._ready.set()
                    continue
                self._apply(entry.key, entry.value, entry.operation)
        finally:
            await watcher.stop()

    def _apply(self, key: str, value: bytes | None, operation: str | None) -> None:
        # A TTL limit marker arrives as PURGE with an empty value: the node stopped beating.
        if operation in _GONE or not value:
            self.adverts.pop(key, None)
        else:
            try:
                self.adverts[key] = decode(NodeAdvert, value)
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
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
