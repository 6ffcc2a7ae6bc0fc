"""A result message read: the chunks its subject names, its body checked, its output read back.

The results stream holds one message per subject: a chunk's `ChunkResult`, or a pack's
`PackResult` on a `<first>.<last>` subject. A message that is not what its subject says
holds that subject's place all the same, so its chunks get failed results naming why. An
output too large for a message was put in the tenant's outputs store: it is read from there.
"""

from __future__ import annotations

import logging

import attrs
from nats.aio.msg import Msg

from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import ErrorKind, InvalidMessage, from_nats
from vramfabric.broker.messages import ChunkResult, JobSpec
from vramfabric.broker.objects import read_written_object
from vramfabric.broker.packs import PackResult
from vramfabric.broker.settings import BrokerSettings

from ..jobs.job import Span

log = logging.getLogger(__name__)


def decode_result(
    msg: Msg, span: Span | None, spec: JobSpec
) -> tuple[Span, ChunkResult | PackResult]:
    """The chunks `msg` holds the results of (`span`, from its subject) and its body.

    Raises:
        InvalidMessage: the subject names no chunk of the job, or the body is not the
            result of the chunks it names.
    """
    if span is None:
        raise InvalidMessage("result subject", f"{msg.subject!r} names no chunk of the job")
    if msg.subject.count(".") == 5:  # `<first>.<last>`: a pack's
        pack = decode(PackResult, msg.data)
        if pack.job != spec.job_id or (pack.first, pack.last) != span:
            raise InvalidMessage(
                "PackResult", f"chunks {pack.job}:{pack.first}-{pack.last} on another subject"
            )
        return span, pack
    result = decode(ChunkResult, msg.data)
    if result.job != spec.job_id or result.index != span[0]:
        raise InvalidMessage(
            "ChunkResult", f"chunk {result.job}:{result.index} on subject {msg.subject}"
        )
    return span, result


def failed_results(job_id: str, span: Span, exc: InvalidMessage) -> list[ChunkResult]:
    """A failed result, naming `exc`, for each chunk of `span` (its message was not valid)."""
    return [
        ChunkResult(
            job=job_id, index=index, ok=False, error_kind=ErrorKind.INVALID_MESSAGE, error=str(exc)
        )
        for index in range(span[0], span[1] + 1)
    ]


async def fetch_output(
    conn: Connection, broker: BrokerSettings, tenant: str, result: ChunkResult
) -> ChunkResult:
    """The result with its output read from the outputs store, if it was put there.

    Failed, naming why, if it cannot be read.
    """
    if not result.ok or result.output_ref is None:
        return result
    bucket = broker.subjects.outputs_store(tenant)
    try:
        got = await read_written_object(conn.js, broker.call_retry, bucket, str(result.output_ref))
        if got is None:
            raise InvalidMessage("output", f"no object {result.output_ref} in {bucket}")
    except Exception as exc:  # recorded: the chunk's result becomes a failed one, logged
        err = from_nats(exc)
        log.warning("output unreadable job=%s index=%d error=%s", result.job, result.index, err)
        return attrs.evolve(
            result,
            ok=False,
            error_kind=ErrorKind.INVALID_MESSAGE,
            error=f"output {result.output_ref} not readable from the outputs store: {err}",
        )
    return attrs.evolve(result, output=got)
