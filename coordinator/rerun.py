"""Rerunning the failed chunks of a job: reopen their subjects in the results stream.

The results stream keeps the first result of each chunk for good, so a failed or exhausted
chunk is final for its job id. `Fabric.run(job, retry_failed=True)` sets the job's stored
failed results aside while its results consumer replays the stream (one read of each
result: see ResultsConsumer.replayed), purges them here, which reopens their subjects, and
submits those chunks again under fresh message ids (the work stream's dedup window would
swallow the old ones).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import nats_errors
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.settings import BrokerSettings

log = logging.getLogger(__name__)


async def reopen(
    conn: Connection, broker: BrokerSettings, spec: JobSpec, indices: Collection[int]
) -> None:
    """Purge the stored results of these chunks, so new results can be recorded."""
    s = broker.subjects
    stream = s.results_stream(spec.tenant)
    for index in sorted(indices):
        with nats_errors():
            await conn.js.purge_stream(stream, subject=s.result(spec.tenant, spec.job_id, index))
    if indices:
        log.info("failed chunks reopened job=%s count=%d", spec.job_id, len(indices))
