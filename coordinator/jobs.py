"""Jobs: the spec (id = hash of the spec), chunk submission with Nats-Msg-Id, and resume.

A rerun of the same job id reads which chunks already have results in the tenant's results
stream and submits only the others; the work stream's dedup swallows chunks still queued.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from vramfabric.broker.codec import encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import Disconnected, from_nats
from vramfabric.broker.messages import Chunk, JobSpec
from vramfabric.broker.retry import RetryPolicy
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import HEADER_MSG_ID
from vramfabric.kernels import Kernel

from .settings import CoordinatorSettings

log = logging.getLogger(__name__)

# Submission is acked within this long of the last publish, or the stream is unreachable.
_PUBLISH_DEADLINE_S = 30.0


@attrs.frozen
class Job:
    """What a user runs: a kernel over a sequence of chunk inputs, with fixed args.

    Leave `job_id` empty to derive it from the kernel, args and inputs: the same job run
    twice is then a resume, not a duplicate.
    """

    kernel: Kernel
    inputs: Sequence[bytes]
    args: Mapping[str, Any] = attrs.field(factory=dict)
    job_id: str = ""
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)

    def spec(self, settings: CoordinatorSettings) -> JobSpec:
        """The JobSpec stored in KV and read by workers.

        Raises:
            ValueError: no inputs, or a chunk over the kernel's or the wire's size limit.
        """
        if not self.inputs:
            raise ValueError("a job needs at least one chunk input")
        for key, value in self.args.items():
            if not isinstance(key, str) or not isinstance(value, int | float | str | bytes | bool):
                raise ValueError(
                    f"job arg {key!r} must be a str key with an int, float, str, "
                    f"bytes or bool value, got {type(value).__name__}"
                )
        limit = min(self.kernel.max_input_bytes, settings.max_chunk_bytes)
        digest = hashlib.sha256()
        for i, data in enumerate(self.inputs):
            if len(data) > limit:
                raise ValueError(f"chunk {i} is {len(data)} bytes; the limit is {limit}")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
        return JobSpec(
            tenant=settings.tenant,
            kernel=self.kernel.name,
            kernel_digest=self.kernel.digest,
            n_chunks=len(self.inputs),
            args=dict(self.args),
            inputs_digest=digest.hexdigest(),
            retry=self.retry,
            ack_wait_s=settings.ack_wait_s,
            job_id=self.job_id,
        )


async def submit_chunks(
    conn: Connection,
    broker: BrokerSettings,
    spec: JobSpec,
    inputs: Sequence[bytes],
    indices: Sequence[int],
) -> int:
    """Publish the given chunks with idempotent ids; return how many were already queued.

    Publishes are asynchronous in a window bounded by the JetStream context's
    `publish_async_max_pending`; the whole batch is awaited under a deadline, since a
    rejected async publish would otherwise never resolve (nats.py #985).
    """
    subject = broker.subjects.work(spec.tenant, spec.job_id)
    futures = []
    try:
        for i in indices:
            data = encode(Chunk(job=spec.job_id, index=i, input=bytes(inputs[i])))
            headers = {HEADER_MSG_ID: broker.subjects.chunk_msg_id(spec.job_id, i)}
            futures.append(await conn.js.publish_async(subject, data, headers=headers))
        acks = await asyncio.wait_for(asyncio.gather(*futures), _PUBLISH_DEADLINE_S)
    except TimeoutError:
        raise Disconnected(f"chunk submission of job {spec.job_id} was not acked in time") from None
    except Exception as exc:
        raise from_nats(exc) from exc
    return sum(1 for ack in acks if ack.duplicate)


async def finished_chunks(conn: Connection, broker: BrokerSettings, spec: JobSpec) -> set[int]:
    """Indices of the job's chunks that already have a result in the results stream."""
    s = broker.subjects
    stream = s.results_stream(spec.tenant)
    prefix = s.result_filter(spec.tenant, spec.job_id)[:-1]
    done: set[int] = set()
    offset = 0
    while True:
        # Raw STREAM.INFO with paging: the server sends subject details in pages.
        body = json.dumps(
            {"subjects_filter": s.result_filter(spec.tenant, spec.job_id), "offset": offset}
        ).encode()
        try:
            reply = await conn.nc.request(
                s.stream_info_api(stream), body, timeout=broker.request_timeout_s
            )
        except Exception as exc:
            raise from_nats(exc) from exc
        info = json.loads(reply.data)
        if "error" in info:
            raise Disconnected(f"stream info for {stream} failed: {info['error']}")
        subjects = info.get("state", {}).get("subjects") or {}
        done.update(int(subj[len(prefix) :]) for subj in subjects)
        offset += len(subjects)
        if not subjects or offset >= int(info.get("total", 0)):
            return {i for i in done if i < spec.n_chunks}
