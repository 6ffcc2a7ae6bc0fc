"""Who drives a job: its heartbeat while a process runs it, and how it was started.

A run record says `running` from the start of a run to its end, so a coordinator that dies
(kill -9, a lost host, a closed laptop) leaves its job `running` for ever. So the process
driving a job also keeps `vf_jobs` key `<tenant>.<job>.alive` (a `JobDriver`) written with
a per-message TTL of TTL_BEATS beats, again every beat: the server drops it once its
process stops beating, and a `running` record without it reads as ORPHANED. A run that
ends deletes it (with a marker that expires too). `vramfabric run` also stores the job's
`JobOrigin` (`<tenant>.<job>.origin`, kept): the job file that rebuilds the job, so that
`Fabric.job(ID).result()` can resume it from another process (coordinator/api/jobhandle.py).

Both keys are plain publishes and direct gets on the tenant's own keys: nothing a tenant
is not granted already (broker/auth.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time

import attrs
import nats.errors

from vramfabric.broker import buckets
from vramfabric.broker.codec import decode, encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, VramfabricError, nats_errors
from vramfabric.broker.jobdriver import JobDriver, JobOrigin
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.stopping import stop_task

from .record import read_key

log = logging.getLogger(__name__)

# Seconds between two beats of a job's driver.
BEAT_S = 2.0
# A driver is taken for gone this many beats after its last one (the key's TTL).
TTL_BEATS = 4
# What a `running` job whose driver stopped beating is listed as.
ORPHANED = "orphaned"
# Header of a KV delete marker.
_KV_OPERATION = "KV-Operation"


def ttl_s(beat_s: float) -> int:
    """The heartbeat key's TTL in whole seconds (the server's unit), at least 1."""
    return max(1, math.ceil(TTL_BEATS * beat_s))


@attrs.define
class Heartbeat:
    """Keeps a job's `.alive` key written while this process drives the job."""

    conn: Connection
    broker: BrokerSettings
    tenant: str
    job: str
    beat_s: float = BEAT_S
    _task: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    _failing: bool = attrs.field(default=False, init=False)

    @property
    def _subject(self) -> str:
        s = self.broker.subjects
        return s.kv_subject(s.jobs_bucket(), s.job_alive_key(self.tenant, self.job))

    async def start(self) -> None:
        """Beat once (before the run's record says `running`), then every `beat_s`."""
        driver = JobDriver(self.job, socket.gethostname(), os.getpid(), time.time(), self.beat_s)
        data = encode(driver)
        await self._beat(data)
        self._task = asyncio.get_running_loop().create_task(self._beating(data))

    async def _beating(self, data: bytes) -> None:
        while True:
            await asyncio.sleep(self.beat_s)  # the beat's period, not synchronisation
            await self._beat(data)

    async def _beat(self, data: bytes) -> None:
        try:
            with nats_errors():
                await self.conn.js.publish(self._subject, data, msg_ttl=ttl_s(self.beat_s))
        except VramfabricError as exc:
            # Recorded as a log line: a lost server costs beats (the job may read as orphaned
            # until the next one lands), never the run.
            if not self._failing:
                log.warning("job heartbeat not written job=%s error=%s", self.job, exc)
            self._failing = True
            return
        if self._failing:
            log.info("job heartbeat written again job=%s", self.job)
        self._failing = False

    async def stop(self) -> None:
        """Stop beating and delete the key: the job's record now says how its run ended."""
        task, self._task = self._task, None
        if task is not None:
            error = await stop_task(task)  # a beat's publish may swallow one cancel
            if error is not None:
                log.warning("job heartbeat had stopped job=%s error=%r", self.job, error)
        try:
            with nats_errors():
                # A delete marker with the same TTL: it hides the last beat, then goes too.
                await self.conn.js.publish(
                    self._subject, b"", headers={_KV_OPERATION: "DEL"}, msg_ttl=ttl_s(self.beat_s)
                )
        except (VramfabricError, nats.errors.Error) as exc:  # the key expires on its own
            log.debug("job heartbeat not deleted job=%s error=%s", self.job, exc)


async def read_driver(
    conn: Connection, broker: BrokerSettings, tenant: str, job: str
) -> JobDriver | None:
    """The process driving the job now, or None if none beats (or its beat does not decode)."""
    data, _ = await read_key(conn.js, broker, broker.subjects.job_alive_key(tenant, job))
    if data is None:
        return None
    try:
        return decode(JobDriver, data)
    except InvalidMessage as exc:
        log.warning("bad job heartbeat ignored job=%s error=%s", job, exc)
        return None


async def write_origin(
    conn: Connection, broker: BrokerSettings, tenant: str, origin: JobOrigin
) -> None:
    """Store how the job was started (before its run starts, so a resume can find it)."""
    s = broker.subjects
    subject = s.kv_subject(s.jobs_bucket(), s.job_origin_key(tenant, origin.job))
    await buckets.put_jobs_key(conn.js, broker, subject, encode(origin))


async def read_origin(
    conn: Connection, broker: BrokerSettings, tenant: str, job: str
) -> JobOrigin | None:
    """How the job was started, or None if not from a job file (or unreadable)."""
    data, _ = await read_key(conn.js, broker, broker.subjects.job_origin_key(tenant, job))
    if data is None:
        return None
    try:
        return decode(JobOrigin, data)
    except InvalidMessage as exc:
        log.warning("bad job origin ignored job=%s error=%s", job, exc)
        return None


def driven_by(driver: JobDriver) -> str:
    """The driving process in words: `pid 1234 on host`."""
    return f"pid {driver.pid} on {driver.host}"


def resume_hint(job: str, origin: JobOrigin | None) -> str:
    """How to resume a job whose driver is gone."""
    if origin is None:
        return "run the same Job again with Fabric.run (it was started from Python)"
    where = "" if origin.host == socket.gethostname() else f" (on {origin.host})"
    return f"vramfabric run --detach {origin.jobfile}{where}, or Fabric.job({job!r}).result()"
