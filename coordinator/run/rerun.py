"""Rerunning the failed chunks of a job: reopen their subjects in the results stream.

The results stream keeps the first result of each chunk for good, so a failed or exhausted
chunk is final for its job id. `Fabric.run(job, retry_failed=True)` sets the job's stored
failed results aside while its results consumer replays the stream (one read of each
result: see ResultsConsumer.replayed), purges them here, which reopens their subjects, and
submits those chunks again under fresh message ids (the work stream's dedup window would
swallow the old ones). A failure inside a pack's result reopens the pack's subject: its
other chunks' results go with it and those chunks run again (their results are not folded
twice).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import nats_errors
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.settings import BrokerSettings

from ..jobs.job import Span

log = logging.getLogger(__name__)


async def reopen(
    conn: Connection,
    broker: BrokerSettings,
    spec: JobSpec,
    indices: Collection[int],
    packs: Collection[Span] = (),
) -> None:
    """Purge the stored results of these chunks and packs, so new results can be recorded."""
    s = broker.subjects
    stream = s.results_stream(spec.tenant)
    in_packs = {i for first, last in packs for i in range(first, last + 1)}
    subjects = [s.result(spec.tenant, spec.job_id, i) for i in sorted(indices) if i not in in_packs]
    subjects += [s.result(spec.tenant, spec.job_id, first, last) for first, last in sorted(packs)]
    for subject in subjects:
        with nats_errors():
            await conn.js.purge_stream(stream, subject=subject)
    if indices:
        log.info(
            "failed chunks reopened job=%s count=%d packs=%d", spec.job_id, len(indices), len(packs)
        )
