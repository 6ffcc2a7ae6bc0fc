"""RunRecord: the running side of a job's lifecycle: its JobRecord in KV, and cancellation.

The coordinator running a job writes `running` at the start and the outcome at the end.
`vramfabric cancel` (coordinator/lifecycle.py) writes `cancelled`; the running coordinator
polls its record and, when it sees that, stops waiting and releases its leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable
from typing import Any

import attrs
import nats.js.errors
from nats.js import JetStreamContext

from vramfabric.broker.codec import decode, encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, JobCancelled, VramfabricError, from_nats
from vramfabric.broker.messages import JobRecord, JobSpec
from vramfabric.broker.settings import BrokerSettings

log = logging.getLogger(__name__)

# How often a running job's record is read for a cancellation.
_POLL_S = 0.5
# An aggregate is stored in the record only up to this size of JSON text.
MAX_VALUE_CHARS = 16_384


async def read_record(
    js: JetStreamContext, broker: BrokerSettings, tenant: str, job: str
) -> JobRecord | None:
    """A job's run record, or None if it has none (or an unreadable one).

    Read with a direct get whose API subject names the key, and written with a plain publish
    to the key's subject: both are granted per tenant when auth is on (broker/auth.py), where
    the KV API on the shared jobs bucket is not.
    """
    s = broker.subjects
    subject = s.kv_subject(s.jobs_bucket(), s.job_state_key(tenant, job))
    try:
        raw = await js.get_msg(s.kv_stream(s.jobs_bucket()), subject=subject, direct=True)
    except nats.js.errors.NotFoundError:  # no record, or purged by `rm`
        return None
    except Exception as exc:
        raise from_nats(exc) from exc
    if not raw.data:
        return None
    try:
        return decode(JobRecord, raw.data)
    except InvalidMessage as exc:
        log.warning("bad job record ignored job=%s error=%s", job, exc)
        return None


async def write_record(
    js: JetStreamContext, broker: BrokerSettings, tenant: str, rec: JobRecord
) -> None:
    """Store a job's run record (a KV put done as a plain JetStream publish)."""
    s = broker.subjects
    subject = s.kv_subject(s.jobs_bucket(), s.job_state_key(tenant, rec.job))
    try:
        await js.publish(subject, encode(rec))
    except Exception as exc:
        raise from_nats(exc) from exc


def value_json(value: Any) -> str | None:
    """The aggregate as JSON text (arrays as lists), or None if it is not JSON or too large."""

    def plain(obj: Any) -> Any:
        if hasattr(obj, "tolist"):
            return obj.tolist()
        raise TypeError(type(obj).__name__)

    try:
        text = json.dumps(value, default=plain)
    except (TypeError, ValueError):
        return None
    return text if len(text) <= MAX_VALUE_CHARS else None


@attrs.define
class RunRecord:
    """Writes one run's record and notices when the job is cancelled."""

    conn: Connection
    broker: BrokerSettings
    spec: JobSpec
    cancelled: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _started: bool = attrs.field(default=False, init=False)
    _started_at: float = attrs.field(factory=time.time, init=False)
    _poller: asyncio.Task[None] | None = attrs.field(default=None, init=False)

    async def start(self) -> None:
        """Record the job as running and start polling for a cancellation."""
        # The jobs bucket exists: Fabric.run stored the spec in it first.
        rec = JobRecord(
            job=self.spec.job_id,
            kernel=self.spec.kernel,
            state="running",
            started_at=self._started_at,
        )
        await write_record(self.conn.js, self.broker, self.spec.tenant, rec)
        self._started = True
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while not self.cancelled.is_set():
            await asyncio.sleep(_POLL_S)  # the poll period itself
            try:
                spec = self.spec
                rec = await read_record(self.conn.js, self.broker, spec.tenant, spec.job_id)
            except VramfabricError as exc:  # a lost server: look again next period
                log.debug("job record unreadable job=%s error=%s", self.spec.job_id, exc)
                continue
            if rec is None or rec.state == "cancelled":  # cancelled, or removed outright
                log.info("job cancelled job=%s", self.spec.job_id)
                self.cancelled.set()

    async def wait(self, done: Awaitable[bool]) -> bool:
        """Await `done` (every chunk in, or a timeout); raise JobCancelled if cancelled first."""
        finished = asyncio.ensure_future(done)
        cancelled = asyncio.ensure_future(self.cancelled.wait())
        try:
            await asyncio.wait({finished, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (finished, cancelled):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        if finished.done() and not finished.cancelled():
            return bool(finished.result())
        raise JobCancelled(f"job {self.spec.job_id} was cancelled")

    async def stop(self) -> None:
        """Stop polling, recording nothing: the run was stopped, and a rerun resumes it."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller

    async def finish(self, state: str, n_ok: int, n_failed: int, value: Any = None) -> None:
        """Record the outcome, unless the job was cancelled or removed meanwhile (best effort)."""
        await self.stop()
        if not self._started:
            return
        try:
            now = await read_record(self.conn.js, self.broker, self.spec.tenant, self.spec.job_id)
            if now is None or now.state == "cancelled":
                return
            rec = attrs.evolve(
                now,
                state=state,
                finished_at=time.time(),
                n_ok=n_ok,
                n_failed=n_failed,
                value=value_json(value) if state in ("done", "failed") else None,
            )
            await write_record(self.conn.js, self.broker, self.spec.tenant, rec)
        except VramfabricError as exc:
            log.warning("job record not written job=%s error=%s", self.spec.job_id, exc)
