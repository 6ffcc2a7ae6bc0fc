"""Agent: the node agent.

Wires GPUs, ledger, lease service, heartbeat, per-job pullers and the executor processes
that run the chunks (the agent itself never runs users' work).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import attrs
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from vramfabric.broker import buckets, tenants
from vramfabric.broker.acked import AckedPublisher
from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, VramfabricError
from vramfabric.broker.messages import Lease, NodeAdvert
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.stopping import stop_tasks

from .adverts import Heartbeat, node_facts
from .chunks.calls import CallService
from .chunks.jobs import LeasedJobs
from .chunks.runner import ChunkRunner
from .chunks.store import ChunkStore
from .chunks.work import WorkLoader, blob_reader
from .executors.pool import ExecutorPool
from .leases.fairness import FleetShare, ShareTiming
from .leases.lease_service import LeaseService
from .leases.ledger import SliceLedger
from .leases.quota import open_book
from .node.advert_book import AdvertBook
from .node.gpus import GpuSpec, discover
from .node.metrics import WorkerMetrics
from .node.policy import PolicyFile
from .node.settings import WorkerSettings

log = logging.getLogger(__name__)


@attrs.define
class Agent:
    """One node: serves leases on its GPUs and runs the chunks of the jobs it holds leases for."""

    broker: BrokerSettings
    settings: WorkerSettings
    conn: Connection
    metrics: WorkerMetrics = attrs.field(factory=WorkerMetrics)
    # The fleet's adverts, when nodes simulated in one process share them (worker/colocated.py);
    # None: this agent hears them itself.
    adverts: AdvertBook | None = None
    ledger: SliceLedger = attrs.field(init=False)
    executors: ExecutorPool = attrs.field(init=False)
    _runner: ChunkRunner = attrs.field(init=False)
    _acks: AckedPublisher = attrs.field(init=False)
    _heartbeat: Heartbeat = attrs.field(init=False)
    _policy: PolicyFile = attrs.field(init=False)
    _service: LeaseService = attrs.field(init=False)
    _sub: Subscription | None = attrs.field(default=None, init=False)
    _calls: CallService = attrs.field(init=False)
    _calls_sub: Subscription | None = attrs.field(default=None, init=False)
    _adverts_sub: Subscription | None = attrs.field(default=None, init=False)
    fair: FleetShare = attrs.field(init=False)
    _tasks: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)
    _jobs: LeasedJobs = attrs.field(init=False)
    _stopping: bool = attrs.field(default=False, init=False)

    def __repr__(self) -> str:
        m = self.metrics
        return (
            f"<Agent node={self.settings.node} leases={len(self.ledger)} jobs={len(self._jobs)}"
            f" submits={m.value('gpu_submit_total'):.0f}"
            f" errors={m.value('gpu_submit_errors_total'):.0f}>"
        )

    async def start(self, probe: bool = True) -> None:
        """Discover GPUs, publish the first advert and start serving lease requests.

        `probe` False skips starting an executor first (nodes simulated side by side: one
        of them has shown that executors start here).

        Raises:
            ValueError: auth is on (the workers' user) but no tenants file is given, which
                would let every tenant run code with no quota.
            ExecutorCrashed: an executor process could not start here.
        """
        if self.broker.user == tenants.WORKERS_USER and not self.settings.tenants_file:
            raise ValueError(
                f"connected as {tenants.WORKERS_USER} (auth on) but VRAMFABRIC_TENANTS is not "
                "set: give workers the tenants' policy file, or every tenant could run code "
                "with no quota"
            )
        gpus = discover(self.settings)
        await self._make_parts(gpus)
        await self._subscribe(gpus[0].simulated)
        # Never ready when its executors cannot start at all (ExecutorCrashed from the probe);
        # where the agent vouches for them they start meanwhile (a first chunk may wait).
        if probe:
            await self.executors.probe()
        # Under the retry policy: the nodes bucket of a cluster just formed may have no
        # stream leader yet ('no response from stream'), and a worker must not die of that.
        await self.broker.call_retry.call(self._heartbeat.beat, what="first advert")
        self._spawn(self._heartbeat.run())
        log.info(
            "agent started node=%s gpus=%d simulated=%s isolation=%s slices=%d",
            self.settings.node,
            len(gpus),
            gpus[0].simulated,
            self.settings.isolation,
            self.ledger.advert(time.time()).free_slices(self.settings.slice_bytes),
        )

    async def _make_parts(self, gpus: tuple[GpuSpec, ...]) -> None:
        """Make the ledger, executors, fair share, chunk runner, heartbeat and lease service."""
        self.ledger = SliceLedger(
            self.settings.node, gpus, self.settings.slice_bytes, self.settings.max_ttl_s
        )
        self.executors = ExecutorPool(self.settings, gpus)
        self._policy = PolicyFile(self.settings.tenants_file)
        policy = self._policy.load()
        book = self.adverts if self.adverts is not None else AdvertBook(self.broker.node_ttl_s)
        self.fair = FleetShare(self.ledger, policy, book, ShareTiming.of(self.settings))
        js = self.conn.js
        nodes_kv = await buckets.nodes_bucket(js, self.broker)
        self._runner = ChunkRunner(
            self.settings,
            self.ledger,
            self.executors,
            WorkLoader(blob_reader(self.conn, self.broker)),
            ChunkStore(self.conn, self.broker),
            simulated=gpus[0].simulated,
            policy=policy,
        )
        self._heartbeat = Heartbeat(
            self.conn,
            self.broker.subjects,
            nodes_kv,
            self.ledger,
            self.metrics,
            self.settings.heartbeat_s,
            on_beat=self._on_beat,
            facts=node_facts(self.settings, self.executors.containment.mode),
            live_facts=lambda: self.fair.advert_facts(time.monotonic()),
        )
        self._service = LeaseService(
            self.broker.subjects,
            self.settings.node,
            self.ledger,
            self.metrics,
            self._on_change,
            publish=self.conn.nc.publish,
            fair=self.fair,
            on_waiting=self._heartbeat.poke,
            quota=await open_book(js, self.broker, self.ledger, policy),
            queue_limit=self.settings.lease_queue,
            gpu_idle_s=self.settings.gpu_idle_s,
        )
        # Every heartbeat takes back what others wait for, whatever the leases' TTL.
        self._heartbeat.reclaim = self._service.reclaim

    async def _subscribe(self, simulated: bool) -> None:
        """Hear the fleet's adverts, lease requests and calls (the acks' publisher first)."""
        subjects = self.broker.subjects
        if self.adverts is None:
            # Other nodes' adverts: the fleet-wide usage behind quotas and the fair share.
            self._adverts_sub = await self.conn.nc.subscribe(
                subjects.advert_filter(), cb=self.hear_advert
            )
        self._acks = await AckedPublisher(self.conn.nc, self.broker.request_timeout_s).start()
        self._jobs = LeasedJobs(
            self.conn,
            self.broker,
            self.settings,
            self.ledger,
            self.executors,
            self._runner,
            self.metrics,
            self._acks,
            spawn=self._spawn,
            on_change=self._on_change,
        )
        self._sub = await self.conn.nc.subscribe(
            subjects.lease_filter(self.settings.node), cb=self._service.handle
        )
        self._calls = CallService(subjects, self._runner, self.metrics, simulated)
        self._calls_sub = await self.conn.nc.subscribe(
            subjects.call_filter(self.settings.node), cb=self._calls.dispatch
        )
        # The server must know the subscription before the first advert tells anyone to ask.
        await self.conn.nc.flush()

    async def hear_advert(self, msg: Msg) -> None:
        """Take in an advert from the advert subject (counted and dropped if it is garbage)."""
        try:
            self.fair.book.heard(decode(NodeAdvert, msg.data), time.monotonic())
        except InvalidMessage as exc:
            self.metrics.invalid("advert")
            log.warning("bad advert ignored subject=%s error=%s", msg.subject, exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_death)

    def _on_change(self, tenant: str, job: str) -> None:
        self._heartbeat.poke()
        key = (tenant, job)
        self._reap_executors()
        if self.broker.subjects.is_interactive(job):
            # Calls come by request-reply (worker/chunks/calls.py): no job, so no puller.
            self._calls.leases_changed()
            for lease in self.ledger.leases_of(tenant, job):
                if not self._stopping:
                    self.executors.warm(self.executors.key_of(lease, "python"))
            return
        self._jobs.leases_changed(key)

    def _on_beat(self, expired: list[Lease]) -> None:
        policy = self._policy.reread()
        if policy is not None:
            self._follow(policy)
        for key in {(lease.tenant, lease.job) for lease in expired}:
            self._on_change(*key)
        self._reap_executors()
        self.executors.keep_spares()

    def _follow(self, policy: tenants.TenantPolicy) -> None:
        """Serve by a reloaded tenants' policy: who may lease, quotas, weights, code."""
        self.fair.policy = policy
        self._runner.policy = policy
        book = self._service.quota
        if book is not None:
            book.policy = policy
        elif any(rules.quota_bytes is not None for rules in policy.tenants.values()):
            # Until it is open, a tenant with a quota is denied (never granted past it).
            self._spawn(self._open_quota(policy))

    async def _open_quota(self, policy: tenants.TenantPolicy) -> None:
        self._service.quota = await open_book(self.conn.js, self.broker, self.ledger, policy)

    def _reap_executors(self) -> None:
        live = {lease.lease_id for lease in self.ledger.holding()}
        self.executors.reap(live, time.monotonic())

    async def abort(self) -> None:
        """Undo a start that did not finish: stop its executors and background tasks."""
        self._stopping = True
        # Unset when the start ended before it made them.
        jobs: LeasedJobs | None = getattr(self, "_jobs", None)
        if jobs is not None:
            jobs.halt()
        executors: ExecutorPool | None = getattr(self, "executors", None)
        if executors is not None:
            await executors.close()
        # Until each has ended: a publish may swallow a cancel (broker/stopping.py).
        await stop_tasks(self._tasks)

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop taking work, let running chunks finish for `grace_s`, release every lease."""
        grace_s = self.settings.drain_grace_s if grace_s is None else grace_s
        self._stopping = True
        self._jobs.halt()
        for sub in (self._sub, self._adverts_sub, self._calls_sub):
            if sub is not None:
                await sub.unsubscribe()
        await self._service.close()
        await self._calls.stop()
        await self._jobs.drain(grace_s)
        # Whatever still runs is killed: a drain is bounded, whatever the kernels do.
        await self.executors.close()
        self._heartbeat.stop()
        # Until each has ended: a publish may swallow a cancel (broker/stopping.py).
        await stop_tasks(self._tasks)
        await self._acks.stop()
        released = self.ledger.reap(float("inf"))
        if self.conn.nc.is_connected:
            # Vanish from the fleet view now; without a server the advert's TTL does it.
            try:
                await asyncio.wait_for(self._heartbeat.goodbye(), self.broker.request_timeout_s)
            except (VramfabricError, TimeoutError) as exc:
                log.warning("advert delete failed node=%s error=%s", self.settings.node, exc)
        log.info("agent stopped node=%s released=%d", self.settings.node, len(released))


def _log_death(task: asyncio.Task[None]) -> None:
    """Log a background task (the heartbeat, a job's puller) that ended with an error."""
    if not task.cancelled() and task.exception() is not None:
        log.error("agent task died task=%s", task.get_name(), exc_info=task.exception())
