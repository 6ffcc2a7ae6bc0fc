"""Job lifecycle for operators: list, inspect, cancel and remove jobs, and sweep old ones.

A job is its spec (KV `vf_jobs` `<tenant>.<job>`), its run record (`<tenant>.<job>.state`,
see record.py), its durable consumer and queued chunks in the work stream, its results in
the results stream, its max-deliveries advisories, checkpoints and large outputs. The
results stream is the truth about a job still running; a finished job's record holds its
counts. Everything here works with auth on, as the tenant: the shared jobs bucket is read
key by key with direct gets and written with plain publishes (broker/auth.py), and a job's
id is found in the tenant's own work and results streams, not by listing the bucket.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from typing import Any

import attrs
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from vramfabric.broker import topology
from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, JobNotFound, PermissionDenied, nats_errors
from vramfabric.broker.messages import ChunkResult, JobRecord, JobSpec
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import Subjects

from .record import delete_key, read_key, read_record, read_record_at, write_record

log = logging.getLogger(__name__)

FINAL_STATES = ("done", "failed", "timeout", "cancelled")
# Results read per pull while counting a job's results.
_SCAN_BATCH = 1000


@attrs.frozen
class JobInfo:
    """What `jobs` and `job ID` show of one job."""

    job: str
    tenant: str
    kernel: str
    state: str
    n_chunks: int
    n_ok: int
    n_failed: int
    started_at: float
    finished_at: float
    failures_by_kind: dict[str, int]
    value: Any = None

    @property
    def n_done(self) -> int:
        """Chunks with a result (ok or failed)."""
        return self.n_ok + self.n_failed

    def as_dict(self, now: float) -> dict[str, Any]:
        """A JSON-ready form, with the age (since the start) at `now`."""
        out = attrs.asdict(self)
        out["n_done"] = self.n_done
        out["age_s"] = round(now - self.started_at, 3) if self.started_at else None
        return out


async def list_jobs(conn: Connection, broker: BrokerSettings, tenant: str) -> list[JobInfo]:
    """Every stored job of the tenant, oldest first; finished ones counted from their record."""
    infos = []
    for job in sorted(await _job_ids(conn, broker, tenant)):
        try:
            infos.append(await inspect(conn, broker, tenant, job, scan=False))
        except JobNotFound:  # results left by a removed job (`sweep` clears them)
            continue
        except InvalidMessage as exc:  # one bad spec must not hide the other jobs
            log.warning("bad job spec skipped job=%s error=%s", job, exc)
            continue
    return sorted(infos, key=lambda i: (i.started_at, i.job))


async def _job_ids(conn: Connection, broker: BrokerSettings, tenant: str) -> set[str]:
    """Ids of the tenant's jobs with queued chunks or results, from its own streams' subjects.

    Not from the shared jobs bucket: listing its keys needs the KV API, which would show
    every tenant's. The server lists up to 100,000 subjects per stream here; a job with no
    chunk queued nor any result yet (stopped before submitting) is not listed.
    """
    s = broker.subjects
    ids: set[str] = set()
    for stream, subjects in (
        (s.work_stream(tenant), s.work_filter(tenant)),
        (s.results_stream(tenant), s.result_filter(tenant)),
    ):
        with nats_errors():
            try:
                info = await conn.js.stream_info(stream, subjects_filter=subjects)
            except nats.js.errors.NotFoundError:
                continue
        for subject in info.state.subjects or {}:
            owner = s.job_of(subject)
            if owner is not None:
                ids.add(owner[1])
    return ids


async def inspect(
    conn: Connection, broker: BrokerSettings, tenant: str, job: str, *, scan: bool = True
) -> JobInfo:
    """One job's state, progress and failures by kind, and its aggregate if stored.

    With `scan` False, a job that finished done or failed is counted from its record (no
    failures by kind), not by reading its results.

    Raises:
        JobNotFound: the tenant has no job of this id.
    """
    spec = await read_spec(conn, broker, tenant, job)
    rec = await read_record(conn.js, broker, tenant, job)
    if not scan and rec is not None and rec.state in ("done", "failed"):
        n_ok, failures = rec.n_ok, Counter[str]()
        n_failed = rec.n_failed
    else:
        n_ok, failures = await _scan(conn, broker, spec)
        n_failed = sum(failures.values())
    state = rec.state if rec else "submitted"
    if state in ("running", "submitted") and n_ok + n_failed == spec.n_chunks:
        state = "failed" if n_failed else "done"
    return JobInfo(
        job=job,
        tenant=tenant,
        kernel=spec.kernel,
        state=state,
        n_chunks=spec.n_chunks,
        n_ok=n_ok,
        n_failed=n_failed,
        started_at=rec.started_at if rec else 0.0,
        finished_at=rec.finished_at if rec else 0.0,
        failures_by_kind=dict(failures),
        value=json.loads(rec.value) if rec and rec.value else None,
    )


async def read_spec(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> JobSpec:
    """The stored spec of a job; JobNotFound if there is none."""
    data, _ = await read_key(conn.js, broker, broker.subjects.job_key(tenant, job))
    if data is None:
        raise JobNotFound(f"no job {job!r} for tenant {tenant!r}")
    return decode(JobSpec, data)


async def _scan(
    conn: Connection, broker: BrokerSettings, spec: JobSpec
) -> tuple[int, Counter[str]]:
    """Read every result of the job once: (ok count, failed count by error kind)."""
    s = broker.subjects
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.ALL,
        inactive_threshold=30.0,  # the server cleans up after a client that died mid-scan
        mem_storage=True,
    )
    n_ok, failures = 0, Counter[str]()
    with nats_errors():
        sub = await conn.js.pull_subscribe(
            s.result_filter(spec.tenant, spec.job_id),
            stream=s.results_stream(spec.tenant),
            config=config,
        )
        try:
            remaining = (await sub.consumer_info()).num_pending or 0
            while remaining > 0:
                # Never ask for more than remain: fetch(n) holds what arrived until n do.
                batch = min(remaining, _SCAN_BATCH)
                msgs = await sub.fetch(batch, timeout=broker.request_timeout_s)
                remaining -= len(msgs)
                for msg in msgs:
                    if s.result_index(msg.subject, spec.tenant, spec.job_id, spec.n_chunks) is None:
                        continue  # stray: no chunk's result (the results consumer drops it too)
                    try:
                        result = decode(ChunkResult, msg.data)
                    except InvalidMessage:
                        failures["invalid_message"] += 1
                        continue
                    if result.ok:
                        n_ok += 1
                    else:
                        failures[result.error_kind.value if result.error_kind else "error"] += 1
        finally:
            await sub.unsubscribe()
    return n_ok, failures


async def cancel(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> bool:
    """Stop a job; False if it had already finished.

    It is marked cancelled (its coordinator releases its leases), its consumer deleted and
    its queued chunks dropped. The record is written only over the one read, so a job that
    finishes meanwhile keeps its outcome (and this returns False).

    Raises:
        JobNotFound: the tenant has no job of this id.
    """
    spec = await read_spec(conn, broker, tenant, job)
    rec, seq = await read_record_at(conn.js, broker, tenant, job)
    if rec is not None and rec.state in FINAL_STATES:
        return False
    cancelled = JobRecord(
        job=job,
        kernel=spec.kernel,
        state="cancelled",
        started_at=rec.started_at if rec else 0.0,
        finished_at=time.time(),
    )
    if not await write_record(conn.js, broker, tenant, cancelled, after=seq):
        return False  # its coordinator recorded the outcome first
    await _stop_work(conn, broker, tenant, job)
    log.info("job cancelled job=%s tenant=%s", job, tenant)
    return True


async def _stop_work(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> None:
    """Delete the job's consumer (workers stop pulling) and its chunks still queued."""
    s = broker.subjects
    await topology.delete_job_consumer(conn.js, broker, tenant, job)
    await _purge(conn, s.work_stream(tenant), s.work(tenant, job))


async def remove(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> None:
    """Delete everything of a job; a running job is cancelled first.

    Gone afterwards: spec, record, consumer, chunks, results, advisories, checkpoints and
    outputs. Without its spec (removed before) whatever is left is still removed: results
    that chunks running during an earlier `rm` published after it.

    Raises:
        JobNotFound: nothing of a job of this id is stored for the tenant.
    """
    s = broker.subjects
    try:
        await cancel(conn, broker, tenant, job)
    except JobNotFound:
        if not await _leftovers(conn, broker, tenant, job):
            raise
    await _stop_work(conn, broker, tenant, job)
    await _purge(conn, s.results_stream(tenant), s.result_filter(tenant, job))
    work = s.work_stream(tenant)
    await _purge(conn, s.dead_stream(tenant), s.max_deliveries(work, s.job_consumer(job)))
    checkpoints = s.checkpoints_bucket()
    try:
        await _purge(conn, s.kv_stream(checkpoints), s.kv_job_filter(checkpoints, tenant, job))
    except PermissionDenied:
        # Only workers write checkpoints (with auth on); a chunk's is deleted with its result.
        log.debug("checkpoints left to the workers job=%s tenant=%s", job, tenant)
    await _delete_outputs(conn, broker, tenant, job)
    for key in (s.job_state_key(tenant, job), s.job_key(tenant, job)):
        await _delete_job_key(conn, broker, key)
    log.info("job removed job=%s tenant=%s", job, tenant)


async def _leftovers(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> bool:
    """Whether results, queued chunks or a record of a job without a spec are stored."""
    s = broker.subjects
    if (await read_key(conn.js, broker, s.job_state_key(tenant, job)))[0] is not None:
        return True
    for stream, subjects in (
        (s.work_stream(tenant), s.work(tenant, job)),
        (s.results_stream(tenant), s.result_filter(tenant, job)),
    ):
        with nats_errors():
            try:
                info = await conn.js.stream_info(stream, subjects_filter=subjects)
            except nats.js.errors.NotFoundError:
                continue
        if info.state.subjects:
            return True
    return False


async def _delete_job_key(conn: Connection, broker: BrokerSettings, key: str) -> None:
    """Drop a key of the shared jobs bucket: purged if this user may, else a delete marker.

    A purge leaves nothing behind, but its subject filter travels in the request payload, so
    tenants are not granted it (it would purge others' keys): theirs write a KV delete
    marker, which reads as no key.
    """
    s = broker.subjects
    try:
        await _purge(conn, s.kv_stream(s.jobs_bucket()), s.kv_subject(s.jobs_bucket(), key))
    except PermissionDenied:
        await delete_key(conn.js, broker, key)


async def _purge(conn: Connection, stream: str, subject: str) -> None:
    """Purge a stream's messages on `subject` (wildcards allowed); a missing stream is fine."""
    with nats_errors(), contextlib.suppress(nats.js.errors.NotFoundError):
        await conn.js.purge_stream(stream, subject=subject)


async def _delete_outputs(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> None:
    """Delete the job's large outputs from the tenant's outputs store."""
    store = await topology.outputs_store(conn.js, broker, tenant)
    with nats_errors():
        try:
            infos = await store.list()
        except nats.js.errors.NotFoundError:  # an empty store
            return
    for info in infos:
        parsed = Subjects.parse_output_object(info.name)
        if parsed is not None and parsed[0] == job and not info.deleted:
            with nats_errors():
                await store.delete(info.name)


async def sweep(
    conn: Connection, broker: BrokerSettings, tenant: str, retention_s: float, now: float
) -> list[str]:
    """Remove the tenant's jobs that finished more than `retention_s` before `now`.

    Read from the jobs' records alone (no results are read). Results without a spec or
    record, left by chunks that ran during an `rm`, are removed too.
    """
    removed = []
    for job in sorted(await _job_ids(conn, broker, tenant)):
        rec = await read_record(conn.js, broker, tenant, job)
        if rec is None:
            spec, _ = await read_key(conn.js, broker, broker.subjects.job_key(tenant, job))
            expired = spec is None  # no spec either: leftovers of a removed job
        else:
            ended = rec.finished_at
            expired = rec.state in FINAL_STATES and 0 < ended < now - retention_s
        if not expired:
            continue
        try:
            await remove(conn, broker, tenant, job)
        except JobNotFound:  # removed meanwhile
            continue
        removed.append(job)
    return removed
