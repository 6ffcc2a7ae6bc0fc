"""Agent: the node agent.

Wires GPUs, ledger, lease service, heartbeat, per-job pullers and the executor processes
that run the chunks (the agent itself never runs users' work).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

import attrs
import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from vramfabric.broker import buckets, tenants
from vramfabric.broker.acked import AckedPublisher
from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, PermissionDenied, VramfabricError, from_nats
from vramfabric.broker.messages import JobSpec, Lease, NodeAdvert
from vramfabric.broker.objects import read_written_object
from vramfabric.broker.settings import BrokerSettings

from .adverts import Heartbeat, node_facts
from .chunks.calls import CallService
from .chunks.puller import JobPuller
from .chunks.runner import ChunkRunner
from .chunks.store import ChunkStore
from .chunks.work import WorkLoader
from .executors.pool import ExecutorPool
from .leases.fairness import FleetShare, ShareTiming
from .leases.lease_service import LeaseService
from .leases.ledger import SliceLedger
from .leases.quota import open_book
from .node.advert_book import AdvertBook
from .node.gpus import GpuSpec, check_slice, discover_nvml, parse_simulate
from .node.metrics import WorkerMetrics
from .node.policy import PolicyFile
from .node.settings import WorkerSettings

log = logging.getLogger(__name__)

JobKey = tuple[str, str]  # (tenant, job)


def discover(settings: WorkerSettings) -> tuple[GpuSpec, ...]:
    """The node's GPUs: simulated when asked, else NVML.

    Raises:
        ValueError: there are none, or none that holds a slice.
    """
    gpus = parse_simulate(settings.simulate) if settings.simulate else discover_nvml()
    if not gpus:
        raise ValueError("no GPU found through NVML; run with --simulate COUNTxSIZE (e.g. 4x48GiB)")
    check_slice(gpus, settings.slice_bytes)
    return gpus


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
    _pullers: dict[JobKey, JobPuller] = attrs.field(factory=dict, init=False)
    _starting: set[JobKey] = attrs.field(factory=set, init=False)
    _stopping: bool = attrs.field(default=False, init=False)
    _stopped: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)

    def __repr__(self) -> str:
        m = self.metrics
        return (
            f"<Agent node={self.settings.node} leases={len(self.ledger)} jobs={len(self._pullers)}"
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
        self.ledger = SliceLedger(
            self.settings.node, gpus, self.settings.slice_bytes, self.settings.max_ttl_s
        )
        self.executors = ExecutorPool(self.settings, gpus)
        self._policy = PolicyFile(self.settings.tenants_file)
        policy = self._policy.load()
        shared = self.adverts is not None
        book = self.adverts if self.adverts is not None else AdvertBook(self.broker.node_ttl_s)
        self.fair = FleetShare(self.ledger, policy, book, ShareTiming.of(self.settings))
        js = self.conn.js
        nodes_kv = await buckets.nodes_bucket(js, self.broker)
        self._runner = ChunkRunner(
            self.settings,
            self.ledger,
            self.executors,
            WorkLoader(self._read_blob),
            ChunkStore(self.conn, self.broker),
            simulated=gpus[0].simulated,
            policy=policy,
        )
        subjects = self.broker.subjects
        self._heartbeat = Heartbeat(
            self.conn,
            subjects,
            nodes_kv,
            self.ledger,
            self.metrics,
            self.settings.heartbeat_s,
            on_beat=self._on_beat,
            facts=node_facts(self.settings, self.executors.containment.mode),
            live_facts=lambda: self.fair.advert_facts(time.monotonic()),
        )
        self._service = service = LeaseService(
            subjects,
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
        self._heartbeat.reclaim = service.reclaim
        if not shared:
            # Other nodes' adverts: the fleet-wide usage behind quotas and the fair share.
            self._adverts_sub = await self.conn.nc.subscribe(
                subjects.advert_filter(), cb=self.hear_advert
            )
        self._acks = await AckedPublisher(self.conn.nc, self.broker.request_timeout_s).start()
        self._sub = await self.conn.nc.subscribe(
            subjects.lease_filter(self.settings.node), cb=service.handle
        )
        self._calls = CallService(subjects, self._runner, self.metrics, gpus[0].simulated)
        self._calls_sub = await self.conn.nc.subscribe(
            subjects.call_filter(self.settings.node), cb=self._calls.dispatch
        )
        # The server must know the subscription before the first advert tells anyone to ask.
        await self.conn.nc.flush()
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
        puller = self._pullers.get(key)
        if puller is not None:
            self._warm(puller.spec)
            puller.leases_changed()
        elif key not in self._starting and not self._stopping:
            self._starting.add(key)
            self._spawn(self._run_puller(key))

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

    def _warm(self, spec: JobSpec) -> None:
        """Start the executors of the job's leases while the coordinator is still submitting."""
        if self._stopping:
            return
        leases = self.ledger.leases_of(spec.tenant, spec.job_id)
        for exec_key in {self.executors.key_of(x, spec.kernel_kind) for x in leases}:
            self.executors.warm(exec_key)

    def _reap_executors(self) -> None:
        live = {lease.lease_id for lease in self.ledger.holding()}
        self.executors.reap(live, time.monotonic())

    async def _run_puller(self, key: JobKey) -> None:
        try:
            spec = await self._load_spec(key)
        finally:
            self._starting.discard(key)
        if spec is None:
            return
        puller = JobPuller(
            self.conn,
            self.broker,
            self.settings,
            spec,
            self.ledger,
            self._runner,
            self.metrics,
            self._acks,
        )
        self._pullers[key] = puller
        self._warm(spec)
        puller.leases_changed()
        try:
            await puller.run()
        finally:
            del self._pullers[key]
        # A grant may have landed while the puller was winding down.
        if self.ledger.leases_of(*key) and not self._stopping:
            self._on_change(*key)

    async def _read_blob(self, tenant: str, digest: str) -> bytes | None:
        """A tenant's uploaded code by digest, from its kernels store (in its account)."""
        bucket = self.broker.subjects.kernels_store(tenant)
        return await read_written_object(
            self.conn.tenant_js(tenant), self.broker.call_retry, bucket, digest
        )

    async def _load_spec(self, key: JobKey) -> JobSpec | None:
        """The job's spec from KV, retried while this node still holds leases for the job.

        Read by a direct get in the tenant's own jobs bucket: with auth on, through the one
        call of it the tenant's account exports to the workers.
        """
        s = self.broker.subjects
        kv_key = s.job_key(*key)
        subject = s.kv_subject(s.jobs_bucket(), kv_key)
        js = self.conn.tenant_js(key[0])
        while self.ledger.leases_of(*key) and not self._stopping:
            try:
                entry = await js.get_msg(s.kv_stream(s.jobs_bucket()), subject=subject, direct=True)
                if entry.data:
                    spec = decode(JobSpec, entry.data)
                    # The key's tenant is the one the lease subject named: a spec claiming
                    # another tenant (or job) would pull and answer that tenant's work.
                    if (spec.tenant, spec.job_id) != key:
                        raise InvalidMessage(
                            "JobSpec", f"spec of {spec.tenant}.{spec.job_id} under key {kv_key}"
                        )
                    return spec
            except InvalidMessage as exc:
                log.error("bad job spec tenant=%s job=%s error=%s", key[0], key[1], exc)
                self.metrics.invalid("job_spec")
            except PermissionDenied as exc:  # no account exports it to the workers
                log.error("job spec refused tenant=%s job=%s error=%s", key[0], key[1], exc)
                return None
            except nats.errors.Error as exc:  # not written yet, or the server is away
                log.warning(
                    "job spec not available tenant=%s job=%s error=%s",
                    key[0],
                    key[1],
                    from_nats(exc),
                )
            # The spec may be written later: poll, but wake at once on stop.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), self.settings.pull_expires_s)
        return None

    async def abort(self) -> None:
        """Undo a start that did not finish: stop its executors and background tasks."""
        self._stopping = True
        self._stopped.set()
        # Unset when the start ended before it made them.
        executors: ExecutorPool | None = getattr(self, "executors", None)
        if executors is not None:
            await executors.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop taking work, let running chunks finish for `grace_s`, release every lease."""
        grace_s = self.settings.drain_grace_s if grace_s is None else grace_s
        self._stopping = True
        self._stopped.set()
        for sub in (self._sub, self._adverts_sub, self._calls_sub):
            if sub is not None:
                await sub.unsubscribe()
        await self._service.close()
        await self._calls.stop()
        # One snapshot: a puller leaves the map as soon as it stops pulling, chunks still running.
        pullers = list(self._pullers.values())
        for puller in pullers:
            puller.stop_pulling()
        # One grace period for all jobs together, not one per job.
        idle = await asyncio.gather(*(p.wait_idle(grace_s) for p in pullers))
        for puller, done in zip(pullers, idle, strict=True):
            if not done:
                await puller.abandon()
        # Whatever still runs is killed: a drain is bounded, whatever the kernels do.
        await self.executors.close()
        self._heartbeat.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
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
