"""LeasedJobs: the jobs this node holds leases for, one puller each, started from its spec.

A grant for a job the node has no puller for reads the job's spec (retried while a lease
of it is held) and starts one; the puller stops when the job's leases are gone. Executors
of a job's leases are started (warmed) as soon as its spec is known, while the coordinator
is still submitting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import attrs
import nats.errors

from vramfabric.broker.acked import AckedPublisher
from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, PermissionDenied, from_nats
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.settings import BrokerSettings

from ..executors.pool import ExecutorPool
from ..leases.ledger import SliceLedger
from ..node.metrics import WorkerMetrics
from ..node.settings import WorkerSettings
from .puller import JobPuller
from .runner import ChunkRunner

log = logging.getLogger(__name__)

JobKey = tuple[str, str]  # (tenant, job)


@attrs.define
class LeasedJobs:
    """The pullers of the jobs this node holds leases for."""

    conn: Connection
    broker: BrokerSettings
    settings: WorkerSettings
    ledger: SliceLedger
    executors: ExecutorPool
    runner: ChunkRunner
    metrics: WorkerMetrics
    acks: AckedPublisher
    # Runs a background task of the agent's (logged if it dies).
    spawn: Callable[[Coroutine[Any, Any, None]], None]
    # Called for a job whose puller ended while the node still holds leases of it.
    on_change: Callable[[str, str], None]
    _pullers: dict[JobKey, JobPuller] = attrs.field(factory=dict, init=False)
    _starting: set[JobKey] = attrs.field(factory=set, init=False)
    _stopping: bool = attrs.field(default=False, init=False)
    _stopped: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)

    def __len__(self) -> int:
        return len(self._pullers)

    def leases_changed(self, key: JobKey) -> None:
        """The node's leases of job `key` changed: tell its puller, or start one."""
        puller = self._pullers.get(key)
        if puller is not None:
            self._warm(puller.spec)
            puller.leases_changed()
        elif key not in self._starting and not self._stopping:
            self._starting.add(key)
            self.spawn(self._run_puller(key))

    def halt(self) -> None:
        """Start no puller again: the node is stopping (a spec being read gives up)."""
        self._stopping = True
        self._stopped.set()

    async def drain(self, grace_s: float) -> None:
        """Stop pulling, let running chunks finish for `grace_s`, abandon what still runs."""
        # One snapshot: a puller leaves the map as soon as it stops pulling, chunks still running.
        pullers = list(self._pullers.values())
        for puller in pullers:
            puller.stop_pulling()
        # One grace period for all jobs together, not one per job.
        idle = await asyncio.gather(*(p.wait_idle(grace_s) for p in pullers))
        for puller, done in zip(pullers, idle, strict=True):
            if not done:
                await puller.abandon()

    def _warm(self, spec: JobSpec) -> None:
        """Start the executors of the job's leases while the coordinator is still submitting."""
        if self._stopping:
            return
        leases = self.ledger.leases_of(spec.tenant, spec.job_id)
        for exec_key in {self.executors.key_of(x, spec.kernel_kind) for x in leases}:
            self.executors.warm(exec_key)

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
            self.runner,
            self.metrics,
            self.acks,
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
            self.on_change(*key)

    async def _load_spec(self, key: JobKey) -> JobSpec | None:
        """The job's spec from KV, retried while this node still holds leases for the job.

        Read by a direct get in the tenant's own jobs bucket: with auth on, through the one
        call of it the tenant's account exports to the workers.
        """
        while self.ledger.leases_of(*key) and not self._stopping:
            try:
                spec = await self._read_spec(key)
                if spec is not None:
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

    async def _read_spec(self, key: JobKey) -> JobSpec | None:
        """The job's spec, read once; None while its key holds nothing.

        Raises:
            InvalidMessage: the spec does not decode, or names another tenant or job.
        """
        s = self.broker.subjects
        kv_key = s.job_key(*key)
        subject = s.kv_subject(s.jobs_bucket(), kv_key)
        js = self.conn.tenant_js(key[0])
        entry = await js.get_msg(s.kv_stream(s.jobs_bucket()), subject=subject, direct=True)
        if not entry.data:
            return None
        spec = decode(JobSpec, entry.data)
        # The key's tenant is the one the lease subject named: a spec claiming another
        # tenant (or job) would pull and answer that tenant's work.
        if (spec.tenant, spec.job_id) != key:
            raise InvalidMessage(
                "JobSpec", f"spec of {spec.tenant}.{spec.job_id} under key {kv_key}"
            )
        return spec
