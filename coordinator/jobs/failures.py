"""A job's failed chunks as stored: each one's error, traceback and the end of what it printed.

What `vramfabric job ID --failures` shows. The results stream holds every chunk's first
result, a failed one included (a pack's failures are in its `PackResult.others`), so a
job's failures are read back from there, in stream order, with one ephemeral consumer;
`limit` bounds how many are kept, not how many results are read.
"""

from __future__ import annotations

import attrs
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import ErrorKind, InvalidMessage, nats_errors
from vramfabric.broker.messages import ChunkResult, JobSpec
from vramfabric.broker.packs import PackResult
from vramfabric.broker.settings import BrokerSettings

# Results read per pull.
_BATCH = 1000
# Failures `job ID --failures` shows unless told otherwise.
DEFAULT_FAILURES = 20


@attrs.frozen
class Failures:
    """Some of a job's failed chunks (in stream order), and how many failed in all."""

    results: tuple[ChunkResult, ...]
    total: int


async def read_failures(
    conn: Connection, broker: BrokerSettings, spec: JobSpec, limit: int = DEFAULT_FAILURES
) -> Failures:
    """The first `limit` failed results of a job in its results stream, and the count of all."""
    s = broker.subjects
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.ALL,
        inactive_threshold=30.0,  # the server cleans up after a client that died mid-read
        mem_storage=True,
    )
    kept: list[ChunkResult] = []
    total = 0
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
                msgs = await sub.fetch(min(remaining, _BATCH), timeout=broker.request_timeout_s)
                remaining -= len(msgs)
                for msg in msgs:
                    span = s.result_range(msg.subject, spec.tenant, spec.job_id, spec.n_chunks)
                    if span is None:
                        continue  # stray: no chunk's result
                    for failure in _failed(msg.data, span, spec.job_id):
                        total += 1
                        if len(kept) < limit:
                            kept.append(failure)
        finally:
            await sub.unsubscribe()
    return Failures(tuple(kept), total)


def _failed(data: bytes, span: tuple[int, int], job: str) -> list[ChunkResult]:
    """The failed results in one stored result (a chunk's, or a pack's `others`)."""
    try:
        if span[0] == span[1]:
            results = [decode(ChunkResult, data)]
        else:
            results = list(decode(PackResult, data).others)
    except InvalidMessage as exc:  # the chunks it holds have no readable result: failed
        return [
            ChunkResult(
                job=job, index=i, ok=False, error_kind=ErrorKind.INVALID_MESSAGE, error=str(exc)
            )
            for i in range(span[0], span[1] + 1)
        ]
    return [r for r in results if not r.ok]
