"""What `jobs` and `job ID` show: a page of a tenant's jobs, and one job in full.

A page comes from the run records alone (records.py), plus, for each job still running,
one count of results and a look at its heartbeat (driver.py: one whose driver is gone is
ORPHANED): its cost does not grow with the jobs and results stored. One job in full
(`inspect`) reads every result of it once, for its failures by kind.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import attrs
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, JobNotFound, nats_errors
from vramfabric.broker.messages import ChunkResult, JobRecord, JobSpec
from vramfabric.broker.packs import PackResult
from vramfabric.broker.settings import BrokerSettings

from .driver import ORPHANED, driven_by, read_driver, read_origin, resume_hint
from .job import Span
from .record import read_key, read_record
from .records import RecordReader, StoredRecord
from .stored import result_spans

# Results read per pull while counting a job's results.
_SCAN_BATCH = 1000
# A job whose record does not decode is listed in this state (so it can be removed).
UNREADABLE = "unreadable"
# Jobs a page shows unless told otherwise.
DEFAULT_PAGE = 100


@attrs.frozen
class JobInfo:
    """What `jobs` and `job ID` show of one job."""

    job: str
    tenant: str
    kernel: str
    state: str
    n_chunks: int
    n_done: int
    # None where not counted: a running job in a listing (counting them reads every result).
    n_failed: int | None
    started_at: float
    finished_at: float
    failures_by_kind: dict[str, int]
    value: Any = None
    # The process driving a running job (`pid 1234 on host`), and how to resume an orphaned one.
    coordinator: str = ""
    resume: str = ""
    # Where a detached coordinator logs.
    log: str = ""

    @property
    def n_ok(self) -> int | None:
        """Chunks that succeeded, where failures were counted."""
        return None if self.n_failed is None else self.n_done - self.n_failed

    def as_dict(self, now: float) -> dict[str, Any]:
        """A JSON-ready form, with the age (since the start) at `now`."""
        out = attrs.asdict(self)
        out["n_ok"] = self.n_ok
        out["age_s"] = round(now - self.started_at, 3) if self.started_at else None
        return out


@attrs.frozen
class JobPage:
    """A page of a tenant's jobs, oldest first, and how many jobs it has in all."""

    jobs: tuple[JobInfo, ...]
    total: int


async def list_jobs(
    conn: Connection, broker: BrokerSettings, tenant: str, limit: int | None = DEFAULT_PAGE
) -> JobPage:
    """The `limit` jobs whose records were written last (all with None), oldest first.

    A job is listed once its coordinator started it (wrote its record). Finished jobs are
    shown from their record; a running one's results are counted (not read) from its
    results stream.
    """
    reader = RecordReader(conn, broker, tenant)
    if limit is None:
        stored = [r async for r in reader.read()]
        total = len(stored)
    else:
        stored = await reader.newest(limit)
        total = await reader.count()
    infos = [await _listed(conn, broker, tenant, r) for r in stored]
    return JobPage(tuple(sorted(infos, key=lambda i: (i.started_at, i.job))), total)


async def _listed(
    conn: Connection, broker: BrokerSettings, tenant: str, stored: StoredRecord
) -> JobInfo:
    rec = stored.record
    if rec is None:
        return JobInfo(stored.job, tenant, "?", UNREADABLE, 0, 0, None, 0.0, 0.0, {})
    n_chunks = rec.n_chunks or rec.n_ok + rec.n_failed
    if rec.state == "running":
        n_done, n_failed = await count_results(conn, broker, tenant, rec.job), None
    else:
        n_done, n_failed = rec.n_ok + rec.n_failed, rec.n_failed
    info = JobInfo(
        job=rec.job,
        tenant=tenant,
        kernel=rec.kernel,
        state=rec.state,
        n_chunks=n_chunks,
        n_done=n_done,
        n_failed=n_failed,
        started_at=rec.started_at,
        finished_at=rec.finished_at,
        failures_by_kind={},
        value=record_value(rec),
    )
    return await with_driver(conn, broker, info)


async def with_driver(conn: Connection, broker: BrokerSettings, info: JobInfo) -> JobInfo:
    """A running job's info with its driver, or ORPHANED with how to resume when it has none."""
    if info.state != "running":
        return info
    driver = await read_driver(conn, broker, info.tenant, info.job)
    origin = await read_origin(conn, broker, info.tenant, info.job)
    log = origin.log if origin else ""
    if driver is not None:
        return attrs.evolve(info, coordinator=driven_by(driver), log=log)
    return attrs.evolve(info, state=ORPHANED, resume=resume_hint(info.job, origin), log=log)


def record_value(rec: JobRecord) -> Any:
    """The aggregate a run record stores (its JSON text parsed), or None."""
    return json.loads(rec.value) if rec.value else None


async def count_results(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> int:
    """How many chunks of a job have a result, nothing read.

    Results of single chunks are one consumer's pending count; those of packs are summed
    from their subjects (`<first>.<last>`), a few hundred for 100,000 packed chunks.
    """
    s = broker.subjects
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.ALL,
        inactive_threshold=10.0,
        mem_storage=True,
    )
    with nats_errors():
        sub = await conn.js.pull_subscribe(
            s.chunk_results(tenant, job), stream=s.results_stream(tenant), config=config
        )
        try:
            singles = (await sub.consumer_info()).num_pending or 0
        finally:
            await sub.unsubscribe()
    packs = await result_spans(conn, broker, tenant, job, packs_only=True)
    return singles + sum(last - first + 1 for first, last in packs)


async def inspect(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> JobInfo:
    """One job's state, progress and failures by kind (every result read once), its aggregate.

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
    info = JobInfo(
        job=job,
        tenant=tenant,
        kernel=spec.kernel,
        state=state,
        n_chunks=spec.n_chunks,
        n_done=n_ok + n_failed,
        n_failed=n_failed,
        started_at=rec.started_at if rec else 0.0,
        finished_at=rec.finished_at if rec else 0.0,
        failures_by_kind=dict(failures),
        value=record_value(rec) if rec else None,
    )
    return await with_driver(conn, broker, info)


async def read_spec(conn: Connection, broker: BrokerSettings, tenant: str, job: str) -> JobSpec:
    """The stored spec of a job; JobNotFound if there is none.

    Raises:
        JobNotFound: the tenant has no job of this id.
        InvalidMessage: the stored spec does not decode.
    """
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
                    span = s.result_range(msg.subject, spec.tenant, spec.job_id, spec.n_chunks)
                    if span is None:
                        continue  # stray: no chunk's result (the results consumer drops it too)
                    try:
                        results = _outcomes(msg.data, span)
                    except InvalidMessage:
                        failures["invalid_message"] += span[1] - span[0] + 1
                        continue
                    for result in results:
                        if result is None or result.ok:
                            n_ok += 1
                        else:
                            failures[result.error_kind.value if result.error_kind else "error"] += 1
        finally:
            await sub.unsubscribe()
    return n_ok, failures


def _outcomes(data: bytes, span: Span) -> list[ChunkResult | None]:
    """A stored result's chunks: None for an ok one of a pack, else its ChunkResult."""
    if span[0] == span[1]:
        return [decode(ChunkResult, data)]
    pack = decode(PackResult, data)
    return [None for out in pack.outputs if out is not None] + list(pack.others)
