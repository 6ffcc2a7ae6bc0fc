"""Job lifecycle for operators: cancel and remove jobs, and sweep old ones.

A job is its spec (KV `vf_jobs` `<tenant>.<job>`), its run record (`<tenant>.<job>.state`,
see record.py), its durable consumer and queued chunks in the work stream, its results in
the results stream, its max-deliveries advisories, checkpoints and large outputs. Reading
jobs (`jobs`, `job ID`) is joblist.py. Everything here works with auth on, as the tenant:
the jobs bucket is read key by key with direct gets and written with plain publishes
(broker/auth.py).
"""

from __future__ import annotations

import contextlib
import logging
import time

import attrs
import nats.js.errors

from vramfabric.broker import buckets, topology
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, JobNotFound, PermissionDenied, nats_errors
from vramfabric.broker.messages import JobRecord
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import Subjects

from .joblist import read_spec
from .record import delete_key, read_key, read_record_at, write_record
from .records import RecordReader

log = logging.getLogger(__name__)

# Reads and conditional writes of a record a cancel tries before it gives up: any replica
# answers a read, so a refused write may mean only that the read came from one behind.
_CANCEL_TRIES = 5

FINAL_STATES = ("done", "failed", "timeout", "cancelled")
# Records a sweep pulls at a time: it usually stops within the first (it runs after every
# run, and only jobs past the retention come before its cutoff).
_SWEEP_BATCH = 100


async def cancel(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> bool:
    """Stop a job; False if it had already finished.

    It is marked cancelled (its coordinator releases its leases), its consumer deleted and
    its queued chunks dropped. The record is written only over the one read, so a job that
    finishes meanwhile keeps its outcome (and this returns False).

    Raises:
        JobNotFound: the tenant has no job of this id.
    """
    try:
        kernel = (await read_spec(conn, broker, tenant, job)).kernel
    except InvalidMessage:  # a spec that does not decode: the job can still be stopped
        kernel = "?"
    for _ in range(_CANCEL_TRIES):
        rec, seq = await read_record_at(conn.js, broker, tenant, job)
        if rec is not None and rec.state in FINAL_STATES:
            return False  # its coordinator recorded the outcome first
        if rec is None:
            cancelled = JobRecord(job=job, kernel=kernel, state="cancelled", started_at=0.0)
        else:  # keeping what it says of the job (its count, its blob)
            cancelled = attrs.evolve(rec, state="cancelled", value=None)
        cancelled = attrs.evolve(cancelled, finished_at=time.time())
        if await write_record(conn.js, broker, tenant, cancelled, after=seq) is not None:
            break
        # Written since the read, or read from a replica behind the last write: read again.
    else:
        return False
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

    Gone afterwards: spec, record, heartbeat and origin, consumer, chunks, results,
    advisories, checkpoints and outputs. Without its spec (removed before) whatever is left
    is still removed: results that chunks running during an earlier `rm` published after it.

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
    for key in (s.job_state_key, s.job_alive_key, s.job_origin_key, s.job_key):
        await _delete_job_key(conn, broker, key(tenant, job))
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
    store = await buckets.outputs_store(conn.js, broker, tenant)
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

    Reads the run records oldest first and stops at the first written after the cutoff:
    records are in the order they were last written, and a finished job's last write is
    its outcome, so a sweep reads only what it removes (plus one record). A job still
    running (or whose coordinator crashed) is kept whatever its age.
    """
    cutoff = now - retention_s
    expired = []
    async for stored in RecordReader(conn, broker, tenant).pull(batch=_SWEEP_BATCH):
        if stored.written_at >= cutoff:
            break
        rec = stored.record
        if rec is not None and rec.state in FINAL_STATES and 0 < rec.finished_at < cutoff:
            expired.append(stored.job)
    removed = []
    for job in expired:
        try:
            await remove(conn, broker, tenant, job)
        except JobNotFound:  # removed meanwhile
            continue
        removed.append(job)
    return removed
