"""Job lifecycle for operators: list, inspect, cancel and remove jobs, and sweep old ones.

A job is its spec (KV `vf_jobs` `<tenant>.<job>`), its run record (`<tenant>.<job>.state`,
see record.py), its durable consumer and queued chunks in the work stream, its results in
the results stream, its max-deliveries advisories, checkpoints and large outputs. The
results stream is the truth about progress: counts are read from it, not from the record.
"""

from __future__ import annotations

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
from vramfabric.broker.errors import InvalidMessage, JobNotFound, from_nats
from vramfabric.broker.messages import ChunkResult, JobRecord, JobSpec
from vramfabric.broker.settings import BrokerSettings

from .record import read_record, write_record

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
    """Every stored job of the tenant, oldest first."""
    kv = await topology.jobs_bucket(conn.js, broker)
    try:
        keys = await kv.keys()  # its `filters` match substrings, not subject wildcards
    except nats.js.errors.NoKeysError:
        return []
    except Exception as exc:
        raise from_nats(exc) from exc
    infos = []
    for key in keys:
        owner, _, job = key.partition(".")
        if owner != tenant or "." in job:  # another tenant's, or a run record
            continue
        try:
            infos.append(await inspect(conn, broker, tenant, job))
        except JobNotFound:  # removed between keys() and get()
            continue
    return sorted(infos, key=lambda i: (i.started_at, i.job))


async def inspect(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> JobInfo:
    """One job's state, progress and failures by kind, and its aggregate if stored.

    Raises:
        JobNotFound: the tenant has no job of this id.
    """
    spec = await read_spec(conn, broker, tenant, job)
    rec = await read_record(conn.js, broker, tenant, job)
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
    kv = await topology.jobs_bucket(conn.js, broker)
    try:
        entry = await kv.get(broker.subjects.job_key(tenant, job))
    except nats.js.errors.NotFoundError:
        raise JobNotFound(f"no job {job!r} for tenant {tenant!r}") from None
    except Exception as exc:
        raise from_nats(exc) from exc
    if not entry.value:
        raise JobNotFound(f"no job {job!r} for tenant {tenant!r}")
    return decode(JobSpec, entry.value)


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
    try:
        sub = await conn.js.pull_subscribe(
            s.result_filter(spec.tenant, spec.job_id),
            stream=s.results_stream(spec.tenant),
            config=config,
        )
        remaining = (await sub.consumer_info()).num_pending or 0
        while remaining > 0:
            # Never ask for more than remain: fetch(n) holds what arrived until n do.
            msgs = await sub.fetch(min(remaining, _SCAN_BATCH), timeout=broker.request_timeout_s)
            remaining -= len(msgs)
            for msg in msgs:
                try:
                    result = decode(ChunkResult, msg.data)
                except InvalidMessage:
                    failures["invalid_message"] += 1
                    continue
                if result.ok:
                    n_ok += 1
                else:
                    failures[result.error_kind.value if result.error_kind else "error"] += 1
        await sub.unsubscribe()
    except Exception as exc:
        raise from_nats(exc) from exc
    return n_ok, failures


async def cancel(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> bool:
    """Stop a job; False if it had already finished.

    It is marked cancelled (its coordinator releases its leases), its consumer deleted and
    its queued chunks dropped.

    Raises:
        JobNotFound: the tenant has no job of this id.
    """
    spec = await read_spec(conn, broker, tenant, job)
    rec = await read_record(conn.js, broker, tenant, job)
    if rec is not None and rec.state in FINAL_STATES:
        return False
    cancelled = JobRecord(
        job=job,
        kernel=spec.kernel,
        state="cancelled",
        started_at=rec.started_at if rec else 0.0,
        finished_at=time.time(),
    )
    await write_record(conn.js, broker, tenant, cancelled)
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
    outputs.

    Raises:
        JobNotFound: the tenant has no job of this id.
    """
    await cancel(conn, broker, tenant, job)
    s = broker.subjects
    await _stop_work(conn, broker, tenant, job)
    await _purge(conn, s.results_stream(tenant), s.result_filter(tenant, job))
    work = s.work_stream(tenant)
    await _purge(conn, s.dead_stream(tenant), s.max_deliveries(work, s.job_consumer(job)))
    checkpoints = s.checkpoints_bucket()
    await _purge(conn, s.kv_stream(checkpoints), s.kv_job_filter(checkpoints, tenant, job))
    await _delete_outputs(conn, broker, tenant, job)
    jobs = s.jobs_bucket()
    # Purged from the stream, not deleted through KV: a delete leaves a marker behind.
    await _purge(conn, s.kv_stream(jobs), s.kv_subject(jobs, s.job_state_key(tenant, job)))
    await _purge(conn, s.kv_stream(jobs), s.kv_subject(jobs, s.job_key(tenant, job)))
    log.info("job removed job=%s tenant=%s", job, tenant)


async def _purge(conn: Connection, stream: str, subject: str) -> None:
    """Purge a stream's messages on `subject` (wildcards allowed); a missing stream is fine."""
    try:
        await conn.js.purge_stream(stream, subject=subject)
    except nats.js.errors.NotFoundError:
        pass
    except Exception as exc:
        raise from_nats(exc) from exc


async def _delete_outputs(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> None:
    """Delete the job's large outputs from the tenant's outputs store."""
    store = await topology.outputs_store(conn.js, broker, tenant)
    try:
        infos = await store.list()
    except nats.js.errors.NotFoundError:  # an empty store
        return
    except Exception as exc:
        raise from_nats(exc) from exc
    for info in infos:
        if info.name.rpartition(".")[0] == job and not info.deleted:
            try:
                await store.delete(info.name)
            except Exception as exc:
                raise from_nats(exc) from exc


async def sweep(
    conn: Connection, broker: BrokerSettings, tenant: str, retention_s: float, now: float
) -> list[str]:
    """Remove the tenant's jobs that finished more than `retention_s` before `now`."""
    removed = []
    for info in await list_jobs(conn, broker, tenant):
        ended = info.finished_at
        if info.state in FINAL_STATES and ended and ended < now - retention_s:
            await remove(conn, broker, tenant, info.job)
            removed.append(info.job)
    return removed
