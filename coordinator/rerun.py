"""Rerunning the failed chunks of a job: find them in the results stream and reopen them.

The results stream keeps the first result of each chunk for good, so a failed or exhausted
chunk is final for its job id. `Fabric.run(job, retry_failed=True)` reads the job's stored
results, purges the failed ones (which reopens their subjects), and submits those chunks
again under fresh message ids (the work stream's dedup window would swallow the old ones).
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, nats_errors
from vramfabric.broker.messages import ChunkResult, JobSpec
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import Subjects

log = logging.getLogger(__name__)

_BATCH = 1000


async def failed_chunks(
    conn: Connection, broker: BrokerSettings, spec: JobSpec, n_stored: int
) -> list[int]:
    """Indices of the job's chunks whose stored result is a failure (none if `n_stored` is 0)."""
    if n_stored == 0:
        return []
    s = broker.subjects
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.ALL,
        inactive_threshold=30.0,
    )
    with nats_errors():
        sub = await conn.js.pull_subscribe(
            s.result_filter(spec.tenant, spec.job_id),
            stream=s.results_stream(spec.tenant),
            config=config,
        )
    failed: set[int] = set()
    try:
        # Read to the end of what is stored, not `n_stored` messages: stray messages on the
        # job's subjects are stored too, and are no chunk's.
        with nats_errors():
            remaining = (await sub.consumer_info()).num_pending or 0
        while remaining > 0:
            with nats_errors():
                # Never ask for more than remain: fetch(n) holds what arrived until n do.
                msgs = await sub.fetch(min(remaining, _BATCH), timeout=broker.request_timeout_s)
            remaining -= len(msgs)
            failed.update(i for m in msgs if (i := _failed_index(s, spec, m)) is not None)
    finally:
        await sub.unsubscribe()
    return sorted(failed)


def _failed_index(s: Subjects, spec: JobSpec, msg: Msg) -> int | None:
    """The chunk index of a stored failed result of the job; None for an ok or stray one."""
    index = s.result_index(msg.subject, spec.tenant, spec.job_id, spec.n_chunks)
    if index is None:
        return None
    try:
        result = decode(ChunkResult, msg.data)
    except InvalidMessage:
        return index  # recorded as failed (invalid_message) when aggregated
    return None if result.ok else index


async def reopen(
    conn: Connection, broker: BrokerSettings, spec: JobSpec, indices: list[int]
) -> None:
    """Purge the stored results of these chunks, so new results can be recorded."""
    s = broker.subjects
    stream = s.results_stream(spec.tenant)
    for index in indices:
        with nats_errors():
            await conn.js.purge_stream(stream, subject=s.result(spec.tenant, spec.job_id, index))
    if indices:
        log.info("failed chunks reopened job=%s count=%d", spec.job_id, len(indices))
