"""Streams and consumers: their configs and idempotent creation, and provisioning.

Creating an existing stream or consumer with the same config is a no-op on the server, so
every process may call `ensure_*` at start-up. Configs live here and in buckets.py (KV
buckets and object stores), and nowhere else.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from .buckets import (
    DUPLICATE_WINDOW_S,
    ERR_CODE_EXISTS_DIFFERENT,
    checkpoints_bucket,
    jobs_bucket,
    kernels_store,
    nodes_bucket,
    outputs_store,
    quota_bucket,
)
from .errors import PermissionDenied, nats_errors
from .messages import JobSpec
from .settings import BrokerSettings

log = logging.getLogger(__name__)

# How many chunks of one job may be out with workers at once (the fleet's in-flight bound).
MAX_ACK_PENDING = 100_000
# Advisories of exhausted chunks are kept a week: long enough for any resume.
DEAD_LETTER_MAX_AGE_S = 7 * 86_400.0


def work_stream_config(settings: BrokerSettings, tenant: str) -> StreamConfig:
    """The tenant's work-queue stream: each chunk is removed once a worker acks it."""
    s = settings.subjects
    return StreamConfig(
        name=s.work_stream(tenant),
        subjects=[s.work_filter(tenant)],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        duplicate_window=DUPLICATE_WINDOW_S,
        num_replicas=settings.replicas,
    )


def results_stream_config(settings: BrokerSettings, tenant: str) -> StreamConfig:
    """The tenant's results stream: one message per chunk subject, and the first one wins.

    No max_age or size limits: evicting a result would reopen its subject to a duplicate.
    """
    s = settings.subjects
    return StreamConfig(
        name=s.results_stream(tenant),
        subjects=[s.result_filter(tenant)],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_msgs_per_subject=1,
        discard=DiscardPolicy.NEW,
        discard_new_per_subject=True,
        duplicate_window=DUPLICATE_WINDOW_S,
        num_replicas=settings.replicas,
    )


def job_consumer_config(settings: BrokerSettings, spec: JobSpec) -> ConsumerConfig:
    """The durable pull consumer every lease of a job shares, with the job's retry policy."""
    s = settings.subjects
    backoff = list(spec.retry.backoff_s(spec.ack_wait_s)) or None
    return ConsumerConfig(
        durable_name=s.job_consumer(spec.job_id),
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=spec.ack_wait_s,
        max_deliver=spec.retry.max_deliver,
        backoff=backoff,
        max_ack_pending=MAX_ACK_PENDING,
        max_waiting=512,
        filter_subject=s.work(spec.tenant, spec.job_id),
    )


def dead_stream_config(settings: BrokerSettings, tenant: str) -> StreamConfig:
    """The tenant's dead-letter stream: max-deliveries advisories, kept while no one listens.

    Advisories are fire-and-forget core messages; captured here, a coordinator that was down
    when a chunk ran out of deliveries still learns of it when it resumes the job.
    """
    s = settings.subjects
    return StreamConfig(
        name=s.dead_stream(tenant),
        subjects=[s.max_deliveries_filter(tenant)],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=DEAD_LETTER_MAX_AGE_S,
        num_replicas=settings.replicas,
    )


async def ensure_tenant(js: JetStreamContext, settings: BrokerSettings, tenant: str) -> None:
    """Create the tenant's work, results and dead-letter streams if they are missing.

    A tenant's own user may not create streams when auth is on: then they must exist
    already (`provision`), and this only checks that they do.
    """
    for config in (
        work_stream_config(settings, tenant),
        results_stream_config(settings, tenant),
        dead_stream_config(settings, tenant),
    ):
        # Retried while JetStream is not ready (a fresh or recovering cluster).
        await settings.call_retry.call(
            functools.partial(_ensure_stream_once, js, config), what=f"create stream {config.name}"
        )


async def provision_fabric(js: JetStreamContext, settings: BrokerSettings) -> None:
    """Create the fleet's shared buckets: adverts, checkpoints, quotas (the operator's job)."""
    await nodes_bucket(js, settings)
    await checkpoints_bucket(js, settings)
    await quota_bucket(js, settings)


async def provision_tenant(js: JetStreamContext, settings: BrokerSettings, tenant: str) -> None:
    """Create one tenant's streams, jobs bucket and stores (in its account, with auth on)."""
    await jobs_bucket(js, settings)
    await ensure_tenant(js, settings, tenant)
    await kernels_store(js, settings, tenant)
    await outputs_store(js, settings, tenant)


async def _ensure_stream_once(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except PermissionDenied:
        # Not ours to create: it must exist already (provisioned by the operator).
        with nats_errors():
            await js.stream_info(str(config.name))
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != ERR_CODE_EXISTS_DIFFERENT:
            raise
        # Exists with another config (e.g. replicas changed): keep it, log the difference.
        log.warning("stream exists with a different config stream=%s", config.name)


async def ensure_job_consumer(
    js: JetStreamContext, settings: BrokerSettings, spec: JobSpec
) -> None:
    """Create the job's shared durable pull consumer (idempotent)."""
    stream = settings.subjects.work_stream(spec.tenant)
    config = job_consumer_config(settings, spec)
    await settings.call_retry.call(
        lambda: js.add_consumer(stream, config), what=f"create consumer {config.durable_name}"
    )


async def delete_job_consumer(
    js: JetStreamContext, settings: BrokerSettings, tenant: str, job: str
) -> None:
    """Delete a finished job's consumer; a missing one is fine."""
    s = settings.subjects
    with nats_errors(), contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_consumer(s.work_stream(tenant), s.job_consumer(job))
