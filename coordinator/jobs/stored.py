"""What the results stream holds for a job: which chunks already have a result.

Read from its subjects alone (one per chunk, or per pack), never from the results themselves.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import nats.js.errors

from vramfabric.broker.connection import Connection
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.settings import BrokerSettings

from .job import UNKNOWN_CHUNKS, Span


async def finished_chunks(conn: Connection, broker: BrokerSettings, spec: JobSpec) -> set[int]:
    """Indices of the job's chunks that already have a result in the results stream."""
    spans = await result_spans(conn, broker, spec.tenant, spec.job_id, spec.n_chunks)
    return {i for first, last in spans for i in range(first, last + 1)}


async def result_spans(
    conn: Connection,
    broker: BrokerSettings,
    tenant: str,
    job: str,
    n_chunks: int = UNKNOWN_CHUNKS,
    packs_only: bool = False,
) -> list[Span]:
    """The (first, last) chunks of each of a job's stored results (of its packs' only)."""
    s = broker.subjects
    stream = s.results_stream(tenant)
    wanted = s.pack_results(tenant, job) if packs_only else s.result_filter(tenant, job)
    spans: list[Span] = []
    offset = 0
    while True:
        # Raw STREAM.INFO with paging: the server sends subject details in pages.
        body = json.dumps({"subjects_filter": wanted, "offset": offset}).encode()
        info = await broker.call_retry.call(
            functools.partial(_stream_info, conn, broker, stream, body), what=f"info {stream}"
        )
        subjects = info.get("state", {}).get("subjects") or {}
        for subject in subjects:
            # A stray subject (`<job>.x`, an index past the end) is no chunk's: skipped.
            span = s.result_range(subject, tenant, job, n_chunks)
            if span is not None:
                spans.append(span)
        offset += len(subjects)
        if not subjects or offset >= int(info.get("total", 0)):
            return spans


async def _stream_info(
    conn: Connection, broker: BrokerSettings, stream: str, body: bytes
) -> dict[str, Any]:
    """One raw STREAM.INFO call; an error reply raises the matching nats-py API error."""
    api = broker.subjects.stream_info_api(stream)
    reply = await conn.nc.request(api, body, timeout=broker.request_timeout_s)
    info: dict[str, Any] = json.loads(reply.data)
    if "error" in info:
        nats.js.errors.APIError.from_error(info["error"])
    return info
