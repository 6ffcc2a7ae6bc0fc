"""JobPuller: one streaming puller per job on this node, one chunk per free lease at a time.

It keeps raw pull requests outstanding on the job's shared durable consumer (NATS_GUIDE.md
section 11: `fetch(n)` can hold an arrived message for its whole timeout) and handles each
chunk the moment it arrives. The server serves one client's requests in order, so each chunk
counts against the oldest open request; a 408/409 status ends the oldest one (its
`Nats-Pending-Messages` is what will not come). Requests ask for idle heartbeats, so a
request that goes silent (its consumer's leader died) or outlives its expiry is known lost
and asked again; a reconnect drops them all at once. ChunkHandler does the work of a chunk.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time

import attrs
import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from vramfabric.broker.acked import AckedPublisher
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import (
    from_nats,
)
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.settings import BrokerSettings

from ..leases.ledger import SliceLedger
from ..node.metrics import WorkerMetrics
from ..node.settings import WorkerSettings
from .handler import ChunkHandler
from .keepalive import quiet
from .runner import ChunkRunner

log = logging.getLogger(__name__)

_STATUS = "Status"
# The server sends a heartbeat this often on an idle pull request; silence means it is lost.
PULL_HEARTBEAT_S = 0.5


@attrs.define
class JobPuller:
    """Pulls one job's chunks for as long as this node holds leases for it."""

    conn: Connection
    broker: BrokerSettings
    settings: WorkerSettings
    spec: JobSpec
    ledger: SliceLedger
    runner: ChunkRunner
    metrics: WorkerMetrics
    acks: AckedPublisher
    handler: ChunkHandler = attrs.field(init=False)
    _free: list[str] = attrs.field(factory=list, init=False)
    _busy: set[str] = attrs.field(factory=set, init=False)
    _outstanding: int = attrs.field(default=0, init=False)
    _last_heard: float = attrs.field(default=0.0, init=False)
    # Open pull requests, oldest first: [messages still to come, monotonic time sent].
    _open: collections.deque[list[float]] = attrs.field(factory=collections.deque, init=False)
    _tasks: dict[asyncio.Task[None], Msg] = attrs.field(factory=dict, init=False)
    # The chunk running on each busy lease: stopped when its lease ends (released, reaped).
    _on_lease: dict[str, asyncio.Task[None]] = attrs.field(factory=dict, init=False)
    _backlog: collections.deque[Msg] = attrs.field(factory=collections.deque, init=False)
    _sub: Subscription | None = attrs.field(default=None, init=False)
    _inbox: str = attrs.field(default="", init=False)
    _wake: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _stopping: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        """Build the chunk handler for this job."""
        self.handler = ChunkHandler(
            self.conn,
            self.broker,
            self.spec,
            self.ledger,
            self.runner,
            self.metrics,
            self.acks,
            stopping=lambda: self._stopping,
        )

    @property
    def tenant(self) -> str:
        """The job's tenant."""
        return self.spec.tenant

    @property
    def job(self) -> str:
        """The job id."""
        return self.spec.job_id

    def leases_changed(self) -> None:
        """Resync the free-lease list with the ledger (after a grant, release or reap)."""
        live = {lease.lease_id for lease in self.ledger.leases_of(self.tenant, self.job)}
        self._free = [i for i in live if i not in self._busy]
        for lease_id in [i for i in self._on_lease if i not in live]:
            # Its lease ended under it: its work stops (the executor killed, the slot's VRAM
            # free only once it is gone) and the chunk goes back for another lease.
            task = self._on_lease.pop(lease_id)
            log.warning("chunk stopped: its lease ended job=%s lease=%s", self.job, lease_id)
            task.cancel()
        self._dispatch()
        self._wake.set()

    def stop_pulling(self) -> None:
        """Stop asking for chunks; chunks in flight run on (see `wait_idle`)."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        """Pull until the job has no leases here and nothing runs, or until stopped."""
        self._inbox = self.conn.nc.new_inbox()
        self._sub = await self.conn.nc.subscribe(self._inbox, cb=self._on_msg)
        self.conn.on_reconnect.append(self._on_reconnect)
        log.info(
            "puller started tenant=%s job=%s leases=%d", self.tenant, self.job, len(self._free)
        )
        try:
            while not self._stopping and (self._free or self._busy):
                await self._top_up()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), PULL_HEARTBEAT_S)
                self._expire_requests()
        finally:
            self.conn.on_reconnect.remove(self._on_reconnect)
            await self._sub.unsubscribe()
            # No lease is left to run what was held back: give it to other nodes now.
            while self._backlog:
                await quiet(self._backlog.popleft().nak())
            log.info("puller stopped tenant=%s job=%s", self.tenant, self.job)

    async def abandon(self) -> int:
        """Stop the chunks still running and nak them, so other leases take them at once."""
        abandoned = list(self._tasks.items())
        for task, msg in abandoned:
            task.cancel()
            await quiet(msg.nak())
        if abandoned:
            log.warning("chunks abandoned on stop job=%s count=%d", self.job, len(abandoned))
        return len(abandoned)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no chunk is in flight; True if that happened within `timeout_s`."""
        if not self._tasks:
            return True
        _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        return not pending

    async def _top_up(self) -> None:
        capacity = min(len(self._free) + len(self._busy), self.settings.max_inflight)
        want = capacity - len(self._busy) - self._outstanding - len(self._backlog)
        # Top up in halves, as nats.go's Consume does, rather than one request per message.
        if want <= 0 or (self._outstanding and want < capacity // 2):
            return
        self._outstanding += want
        self._open.append([want, time.monotonic()])
        body = {
            "batch": want,
            "expires": int(self.settings.pull_expires_s * 1e9),
            "idle_heartbeat": int(PULL_HEARTBEAT_S * 1e9),
        }
        subject = self.broker.subjects.pull_next(
            self.broker.subjects.work_stream(self.tenant),
            self.broker.subjects.job_consumer(self.job),
            self.broker.tenant_api(self.tenant),  # through the tenant account's export
        )
        try:
            await self.conn.nc.publish(subject, json.dumps(body).encode(), reply=self._inbox)
        except nats.errors.Error as exc:  # closed or buffer full: asked again on the next wake
            self._outstanding -= want
            self._open.pop()
            log.warning("pull request failed job=%s error=%s", self.job, from_nats(exc))

    def _on_reconnect(self) -> None:
        # Pull requests die with the connection that sent them: ask again at once.
        while self._open:
            self._end_oldest()
        self._wake.set()

    def _expire_requests(self) -> None:
        # A request whose 408 never came (lost in a reconnect) must not block top-ups forever.
        now = time.monotonic()
        if self._open and now - max(self._last_heard, self._open[0][1]) > 4 * PULL_HEARTBEAT_S:
            # Not even a heartbeat: the consumer's server is gone (a leader died). Ask again.
            log.info("pull requests silent job=%s pending=%d", self.job, self._outstanding)
            while self._open:
                self._end_oldest()
            return
        cutoff = now - self.settings.pull_expires_s - 1
        while self._open and self._open[0][1] < cutoff:
            log.info("pull request lost job=%s pending=%d", self.job, self._open[0][0])
            self._end_oldest()

    def _end_oldest(self) -> None:
        left, _sent = self._open.popleft()
        self._outstanding -= int(left)

    async def _on_msg(self, msg: Msg) -> None:
        self._last_heard = time.monotonic()
        status = msg.headers.get(_STATUS) if msg.headers else None
        if status is not None and not msg.data:
            self._on_status(msg, status)
            return
        if self._open:
            self._outstanding -= 1
            self._open[0][0] -= 1
            if self._open[0][0] <= 0:
                self._open.popleft()
        # Leases shrank since this was asked for: hold it for the next free lease rather than
        # nak it, since a nak would spend one of the chunk's deliveries.
        self._backlog.append(msg)
        self._dispatch()

    def _dispatch(self) -> None:
        now = time.monotonic()
        while self._backlog and self._free:
            lease_id = self._free.pop()
            if not self.ledger.is_live(lease_id, now):
                # Past its deadline, not reaped yet: a chunk sent there would spend a delivery.
                continue
            self._busy.add(lease_id)
            msg = self._backlog.popleft()
            task = asyncio.get_running_loop().create_task(self._handle(msg, lease_id))
            self._tasks[task] = msg
            self._on_lease[lease_id] = task
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)

    def _on_status(self, msg: Msg, status: str) -> None:
        # 408: request expired; 409: ended (max waiting, leader change, consumer deleted).
        if status in ("408", "409") and self._open:
            self._end_oldest()
        description = msg.headers.get("Description", "") if msg.headers else ""
        if status == "409" and "deleted" in description.lower():
            log.info("job consumer deleted job=%s", self.job)
            self.stop_pulling()
        self._wake.set()

    async def _handle(self, msg: Msg, lease_id: str) -> None:
        try:
            await self.handler.handle(msg, lease_id)
        except asyncio.CancelledError:
            if not self._stopping:  # its lease ended (leases_changed): another lease takes it
                await quiet(msg.nak())
            raise
        finally:
            self._busy.discard(lease_id)
            self._on_lease.pop(lease_id, None)
            if self.ledger.is_live(lease_id, time.monotonic()):
                self._free.append(lease_id)
            self._dispatch()
            self._wake.set()
