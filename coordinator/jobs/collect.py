"""Housekeeping for one tenant: old jobs swept, and uploaded work no stored job names removed.

Uploaded functions and CUDA kernels stay in the tenant's kernels store under their digest
so that reruns and resumes find them. Once no stored job's run record names a blob (its
jobs were removed by `rm` or by the retention), nothing can need it but a run starting
right now, between its upload and its record: blobs younger than BLOB_MIN_AGE_S are kept.
"""

from __future__ import annotations

import logging
from datetime import datetime

import attrs
import nats.js.errors

from vramfabric.broker import buckets
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import nats_errors
from vramfabric.broker.settings import BrokerSettings

from .lifecycle import sweep
from .records import RecordReader

log = logging.getLogger(__name__)

# A blob uploaded this recently is kept whoever names it: its run may not have written
# its record yet.
BLOB_MIN_AGE_S = 3600.0


@attrs.frozen
class Collected:
    """What one housekeeping pass removed."""

    jobs: tuple[str, ...]
    blobs: tuple[str, ...]


async def housekeep(
    conn: Connection,
    broker: BrokerSettings,
    tenant: str,
    retention_s: float,
    now: float,
    *,
    blobs: bool = True,
) -> Collected:
    """Remove jobs finished before the retention, then (with `blobs`) the unnamed blobs.

    Collecting blobs reads every run record, so the pass after each run (`Fabric.run`)
    leaves it out and sweeps only, which costs what it removes; `vramfabric gc` does both.
    """
    jobs = await sweep(conn, broker, tenant, retention_s, now) if retention_s else []
    unnamed = await collect_blobs(conn, broker, tenant, now) if blobs else []
    if jobs or unnamed:
        log.info(
            "housekeeping tenant=%s jobs_removed=%d blobs_removed=%d",
            tenant,
            len(jobs),
            len(unnamed),
        )
    return Collected(tuple(jobs), tuple(unnamed))


async def collect_blobs(
    conn: Connection, broker: BrokerSettings, tenant: str, now: float
) -> list[str]:
    """Delete the tenant's uploaded blobs that no run record names (and not uploaded lately).

    A record that does not decode, or was written by a version that did not name its
    blob, could name any: then nothing is collected.
    """
    store = await buckets.kernels_store(conn.js, broker, tenant)
    with nats_errors():
        try:
            infos = await store.list(ignore_deletes=True)
        except nats.js.errors.NotFoundError:  # an empty store
            return []
    if not infos:
        return []
    named = set()
    async for stored in RecordReader(conn, broker, tenant).read():
        if stored.record is None or not stored.record.kernel_digest:
            log.info(
                "blobs not collected tenant=%s: job %s names none it can read", tenant, stored.job
            )
            return []
        named.add(stored.record.kernel_digest)
    removed = []
    for info in infos:
        if info.name in named or now - _uploaded_at(info.mtime) < BLOB_MIN_AGE_S:
            continue
        with nats_errors():
            await store.delete(info.name)
        removed.append(info.name)
    return removed


def _uploaded_at(mtime: str | None) -> float:
    """Unix seconds of an object's upload; now-ish (kept) if the store did not say."""
    try:
        return datetime.fromisoformat(mtime or "").timestamp()
    except ValueError:
        return float("inf")
