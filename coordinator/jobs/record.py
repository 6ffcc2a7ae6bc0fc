"""RunRecord: the running side of a job's lifecycle: its JobRecord in KV, and cancellation.

The coordinator running a job writes `running` at the start and the outcome at the end.
`vramfabric cancel` (coordinator/jobs/lifecycle.py) writes `cancelled`; the running coordinator
is subscribed to its record's subject and, when it sees that, stops waiting and releases
its leases.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable
from typing import Any

import attrs
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import Header

from vramfabric.broker.codec import decode, encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import (
    InvalidMessage,
    JobCancelled,
    PermanentError,
    StaleRead,
    VramfabricError,
    nats_errors,
)
from vramfabric.broker.messages import JobRecord, JobSpec
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.stopping import stop_task

log = logging.getLogger(__name__)

# An aggregate is stored in the record only up to this size of JSON text.
MAX_VALUE_CHARS = 16_384


# JetStream err_code for "wrong last sequence": another writer changed the record first.
ERR_CODE_WRONG_LAST_SEQUENCE = 10071
# Headers marking a KV delete or purge; nats-server 2.11 places its own markers with the second.
_KV_OPERATION, _MARKER_REASON = "KV-Operation", "Nats-Marker-Reason"


async def read_key(
    js: JetStreamContext, broker: BrokerSettings, key: str, at_least: int = 0
) -> tuple[bytes | None, int]:
    """A `vf_jobs` key's value (None if absent or deleted) and its subject's last sequence.

    Read with a direct get whose API subject names the key: granted per tenant when auth is
    on (broker/auth.py), where the KV API on the shared jobs bucket is not. The sequence is
    0 when the key never was written (or was purged).

    Any replica answers a direct get, and a follower may not have stored the last write yet:
    with `at_least` (the sequence this client wrote the key at), an older answer is asked
    again under the call retry policy, and `StaleRead` raised if none catches up.
    """
    return await broker.call_retry.call(
        functools.partial(_read_key_once, js, broker, key, at_least), what=f"read {key}"
    )


async def _read_key_once(
    js: JetStreamContext, broker: BrokerSettings, key: str, at_least: int
) -> tuple[bytes | None, int]:
    s = broker.subjects
    subject = s.kv_subject(s.jobs_bucket(), key)
    stream = s.kv_stream(s.jobs_bucket())
    with nats_errors():
        try:
            raw = await js.get_msg(stream, subject=subject, direct=True)
        except nats.js.errors.NotFoundError:  # never written, or purged by `rm`
            raw = None
        except nats.errors.NoRespondersError:
            # Nothing answers direct gets of a stream that does not exist (no job was ever
            # stored): the key is absent. With the stream there, the error is the server's.
            try:
                await js.stream_info(stream)
            except nats.js.errors.NotFoundError:
                raw = None
            else:
                raise
    seq = 0 if raw is None else raw.seq or 0
    if seq < at_least:
        raise StaleRead(f"{key} read at sequence {seq}, written at {at_least}")
    if raw is None:
        return None, 0
    headers = raw.headers or {}
    if _KV_OPERATION in headers or _MARKER_REASON in headers or not raw.data:
        return None, seq
    return raw.data, seq


async def delete_key(js: JetStreamContext, broker: BrokerSettings, key: str) -> None:
    """Delete a `vf_jobs` key with a KV delete marker: a plain publish a tenant may do."""
    s = broker.subjects
    with nats_errors():
        await js.publish(s.kv_subject(s.jobs_bucket(), key), b"", headers={_KV_OPERATION: "DEL"})


async def read_record_at(
    js: JetStreamContext, broker: BrokerSettings, tenant: str, job: str, at_least: int = 0
) -> tuple[JobRecord | None, int]:
    """A job's run record (None if it has none, or an unreadable one) and its sequence.

    `at_least`: the sequence this client wrote it at (read_key).
    """
    data, seq = await read_key(js, broker, broker.subjects.job_state_key(tenant, job), at_least)
    if data is None:
        return None, seq
    try:
        return decode(JobRecord, data), seq
    except InvalidMessage as exc:
        log.warning("bad job record ignored job=%s error=%s", job, exc)
        return None, seq


async def read_record(
    js: JetStreamContext, broker: BrokerSettings, tenant: str, job: str
) -> JobRecord | None:
    """A job's run record, or None if it has none (or an unreadable one)."""
    return (await read_record_at(js, broker, tenant, job))[0]


async def write_record(
    js: JetStreamContext,
    broker: BrokerSettings,
    tenant: str,
    rec: JobRecord,
    *,
    after: int | None = None,
) -> int | None:
    """Store a job's run record (a KV put done as a plain JetStream publish); its sequence.

    With `after` (the sequence the record was read at, 0 for none), the write happens only
    if nobody wrote the record since: None if someone did (a cancel racing the finish).
    """
    s = broker.subjects
    subject = s.kv_subject(s.jobs_bucket(), s.job_state_key(tenant, rec.job))
    headers = None if after is None else {Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(after)}
    try:
        with nats_errors():
            ack = await js.publish(subject, encode(rec), headers=headers)
    except PermanentError as exc:
        cause = exc.__cause__
        if getattr(cause, "err_code", None) == ERR_CODE_WRONG_LAST_SEQUENCE:
            return None
        raise
    return ack.seq


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
    _seq: int = attrs.field(default=0, init=False)  # of the `running` write; 0: not written
    _started_at: float = attrs.field(factory=time.time, init=False)
    _sub: Subscription | None = attrs.field(default=None, init=False)
    _rereads: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)

    async def start(self) -> None:
        """Record the job as running and watch its record for a cancellation.

        The record's KV subject is subscribed to (a cancel is a plain publish on it), so a
        running job costs no API calls for this; the record is read once after subscribing
        (while the run goes on), and again after each reconnect, for a cancel published while
        nobody listened.
        """
        # The jobs bucket exists: Fabric.run stored the spec in it first.
        rec = JobRecord(
            job=self.spec.job_id,
            kernel=self.spec.kernel,
            state="running",
            started_at=self._started_at,
            n_chunks=self.spec.n_chunks,
            kernel_digest=self.spec.kernel_digest,
        )
        self._seq = await write_record(self.conn.js, self.broker, self.spec.tenant, rec) or 0
        subject = self.broker.subjects.job_record(self.spec.tenant, self.spec.job_id)
        with nats_errors():
            self._sub = await self.conn.nc.subscribe(subject, cb=self._on_update)
        self.conn.on_reconnect.append(self._reread)
        # Read in the background: the run goes on meanwhile, and `wait` sees a cancel found.
        self._reread()

    async def _on_update(self, msg: Msg) -> None:
        deleted = not msg.data or bool(msg.headers and _KV_OPERATION in msg.headers)
        if deleted:
            self._cancel("removed")
            return
        try:
            state = decode(JobRecord, msg.data).state
        except InvalidMessage as exc:
            log.warning("bad job record ignored job=%s error=%s", self.spec.job_id, exc)
            return
        if state == "cancelled":
            self._cancel(state)

    def _reread(self) -> None:
        task = asyncio.get_running_loop().create_task(self._check())
        self._rereads.add(task)
        task.add_done_callback(self._rereads.discard)

    async def _check(self) -> None:
        try:
            # At least at our own write: a replica without it would read as `removed`.
            rec, _ = await read_record_at(
                self.conn.js, self.broker, self.spec.tenant, self.spec.job_id, self._seq
            )
        except VramfabricError as exc:  # a lost server: the next reconnect reads it again
            log.debug("job record unreadable job=%s error=%s", self.spec.job_id, exc)
            return
        if rec is None or rec.state == "cancelled":  # cancelled, or removed outright
            self._cancel("removed" if rec is None else rec.state)

    def _cancel(self, why: str) -> None:
        if not self.cancelled.is_set():
            log.info("job cancelled job=%s record=%s", self.spec.job_id, why)
            self.cancelled.set()

    async def wait(self, done: Awaitable[bool]) -> bool:
        """Await `done` (every chunk in, or a timeout); raise JobCancelled if cancelled first."""
        finished = asyncio.ensure_future(done)
        cancelled = asyncio.ensure_future(self.cancelled.wait())
        try:
            await asyncio.wait({finished, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (finished, cancelled):
                await stop_task(task)  # the run's publishes may swallow one cancel
        if finished.done() and not finished.cancelled():
            return bool(finished.result())
        raise JobCancelled(f"job {self.spec.job_id} was cancelled")

    async def stop(self) -> None:
        """Stop watching, recording nothing: the run was stopped, and a rerun resumes it."""
        if self._reread in self.conn.on_reconnect:
            self.conn.on_reconnect.remove(self._reread)
        for task in list(self._rereads):
            task.cancel()
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except nats.errors.Error as exc:  # a closed connection: nothing left to stop
                log.debug("record watch not unsubscribed job=%s error=%s", self.spec.job_id, exc)

    async def finish(self, state: str, n_ok: int, n_failed: int, value: Any = None) -> None:
        """Record the outcome, unless the job was cancelled or removed meanwhile (best effort)."""
        await self.stop()
        if not self._seq:
            return
        try:
            tenant, job = self.spec.tenant, self.spec.job_id
            now, seq = await read_record_at(self.conn.js, self.broker, tenant, job, self._seq)
            if now is None or now.state == "cancelled":
                return
            rec = attrs.evolve(
                now,
                state=state,
                finished_at=time.time(),
                n_ok=n_ok,
                n_failed=n_failed,
                value=value_json(value) if state in ("done", "failed") else None,
                # Every chunk has its result in a done or failed job: so a streamed job's
                # count (unknown at the start) is known too.
                n_chunks=n_ok + n_failed if state in ("done", "failed") else now.n_chunks,
            )
            # Only over the record just read: a cancel written meanwhile wins.
            if await write_record(self.conn.js, self.broker, tenant, rec, after=seq) is None:
                log.info("job cancelled while finishing job=%s", job)
        except VramfabricError as exc:
            log.warning("job record not written job=%s error=%s", self.spec.job_id, exc)
