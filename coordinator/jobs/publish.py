"""Publishing a job: its spec to `vf_jobs`, its chunks to the work stream with idempotent ids.

A rerun of the same job id reads which chunks already have results in the tenant's results
stream and submits only the others; the work stream's dedup (`Nats-Msg-Id`) swallows chunks
still queued, and those it swallowed that are no longer queued go again under fresh ids.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from vramfabric.broker import buckets
from vramfabric.broker.acked import AckedPublisher, Stored
from vramfabric.broker.codec import encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import (
    Disconnected,
    TransientError,
    from_nats,
    nats_errors,
)
from vramfabric.broker.messages import Chunk, JobSpec
from vramfabric.broker.packs import ChunkPack
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import HEADER_MSG_ID

from .job import Span
from .requeue import not_queued

# One publish's ack is awaited this long before the chunk is published again.
PUBLISH_ACK_WAIT_S = 5.0
# Async publishes in flight at once (the JetStream context allows 1024 pending acks).
_WINDOW = 1000


async def submit_chunks(
    conn: Connection,
    broker: BrokerSettings,
    spec: JobSpec,
    inputs: Sequence[bytes] | Mapping[int, bytes],
    indices: Sequence[int] | Sequence[Span],
    rerun: str = "",
    acks: AckedPublisher | None = None,
) -> int:
    """Publish the given chunks with idempotent ids; return how many were already queued.

    `indices` are chunk indices, or spans `(first, last)` of chunks to publish as one
    message each (a `ChunkPack` when it holds more than one). `rerun` (a token unique to
    this run) gives them fresh ids: chunks submitted again after their failure must not be
    taken for duplicates of the first submission.

    Publishes are asynchronous, in windows of `_WINDOW` awaiting their PubAcks. Chunks whose
    ack does not come (a stream leader lost, say) are published again with the same
    `Nats-Msg-Id`, which the stream deduplicates, under the broker's call retry policy.
    `inputs[i]` is chunk i's input; `acks`, if given, is a started publisher to use.

    Raises:
        Disconnected: some chunks were still not acked at the retry deadline.
        PermanentError: the stream refused a chunk for good (a permission error, say).
    """
    pending: list[Span] = [i if isinstance(i, tuple) else (i, i) for i in indices]
    repeats: list[tuple[Span, int]] = []  # (span, the first message's sequence)
    own = acks is None
    publisher = acks or await AckedPublisher(conn.nc, PUBLISH_ACK_WAIT_S).start()

    async def publish_pending() -> None:
        nonlocal pending
        outcomes = await _publish_round(publisher, broker, spec, inputs, pending, rerun)
        repeats.extend(
            (span, o.seq)
            for span, o in zip(pending, outcomes, strict=True)
            if isinstance(o, Stored) and o.duplicate
        )
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        pending = [
            i for i, o in zip(pending, outcomes, strict=True) if isinstance(o, BaseException)
        ]
        for exc in errors:
            if not isinstance(from_nats(exc), TransientError):
                with nats_errors():
                    raise exc  # refused for good, or a bug: no republishing fixes it
        if errors:
            last = from_nats(errors[-1])
            raise Disconnected(f"job {spec.job_id}: {len(errors)} chunk(s) not acked: {last}")

    try:
        await broker.call_retry.call(publish_pending, what=f"submit chunks job={spec.job_id}")
        gone = await not_queued(conn, broker, spec, repeats) if repeats and not rerun else []
        if gone:
            fresh = uuid.uuid4().hex[:12]
            await submit_chunks(conn, broker, spec, inputs, gone, fresh, publisher)
    finally:
        if own:
            await publisher.stop()
    return len(repeats) - len(gone)


async def _publish_round(
    acks: AckedPublisher,
    broker: BrokerSettings,
    spec: JobSpec,
    inputs: Sequence[bytes] | Mapping[int, bytes],
    spans: Sequence[Span],
    rerun: str,
) -> list[Any]:
    s = broker.subjects  # built once: a property that validates the prefix on every call
    subject = s.work(spec.tenant, spec.job_id)
    job = spec.job_id
    outcomes: list[Any] = []
    # Windows of publishes in flight: a stalled stream costs at most one window's timeout.
    for start in range(0, len(spans), _WINDOW):
        futures: list[asyncio.Future[Any]] = []
        for first, last in spans[start : start + _WINDOW]:
            if first == last:
                data = encode(Chunk(job=job, index=first, input=bytes(inputs[first])))
                end = None
            else:
                # Inputs are bytes already (Job.encode_many): no call per chunk to copy them.
                packed = tuple(map(inputs.__getitem__, range(first, last + 1)))
                data = encode(ChunkPack(job=job, first=first, inputs=packed))
                end = last
            msg_id = (
                s.chunk_retry_msg_id(job, first, rerun, end)
                if rerun
                else s.chunk_msg_id(job, first, end)
            )
            headers = {HEADER_MSG_ID: msg_id}
            try:
                futures.append(await acks.submit(subject, data, headers))
            except Exception as exc:  # e.g. disconnected while publishing: retry this one
                futures.append(_failed(exc))
        # Each future ends by its PubAck, its error or the publisher's timeout.
        await asyncio.wait(futures)
        outcomes += [f.exception() or f.result() for f in futures]
    return outcomes


def _failed(exc: BaseException) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    return future


async def publish_spec(conn: Connection, broker: BrokerSettings, spec: JobSpec) -> None:
    """Store the job's spec in `vf_jobs` (again, for a streamed job whose inputs ran out)."""
    # A KV put is a publish to the key's subject: no KV API call, so a tenant needs no
    # grant that could read or list other tenants' specs in the shared bucket.
    subject = broker.subjects.job_spec(spec.tenant, spec.job_id)
    await buckets.put_jobs_key(conn.js, broker, subject, encode(spec))
