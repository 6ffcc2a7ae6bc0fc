"""KV buckets and object stores: their configs and idempotent creation.

Adverts, job specs and run records, checkpoints, quota reservations, uploaded code and large
outputs. Creating an existing bucket with the same config is a no-op on the server; one made
by another process with other settings is shared (`_create_or_share`). Streams and
consumers are topology.py.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from .errors import PermissionDenied, nats_errors
from .settings import BrokerSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

# Publishers retry with the same Nats-Msg-Id inside this window and stay idempotent.
DUPLICATE_WINDOW_S = 120.0
# JetStream: "stream name already in use with a different configuration".
ERR_CODE_EXISTS_DIFFERENT = 10058


async def nodes_bucket(js: JetStreamContext, settings: BrokerSettings) -> KeyValue:
    """The adverts bucket; its TTL and limit markers let watchers see a node vanish."""
    config = KeyValueConfig(
        bucket=settings.subjects.nodes_bucket(),
        history=1,
        ttl=settings.node_ttl_s,
        limit_marker_ttl=max(1.0, settings.node_ttl_s),
        storage=StorageType.FILE,  # a restarted server must still know the fleet
        replicas=settings.replicas,
    )
    return await _bucket(js, settings, config)


async def kv_keys(js: JetStreamContext, settings: BrokerSettings, bucket: str) -> list[str]:
    """The keys of a KV bucket that hold a message (a value, or a delete or expiry marker).

    Read from the stream's subjects, not with `KeyValue.keys()`: on nats-py 2.16 that
    watcher can signal "no more keys" before the first key it was already sent arrives,
    and then lists none of them (seen in CI with one advert stored).
    """
    s = settings.subjects
    with nats_errors():
        info = await js.stream_info(s.kv_stream(bucket), subjects_filter=s.kv_subjects(bucket))
    head = len(s.kv_subjects(bucket)) - 1  # "$KV.<bucket>."
    return sorted(subject[head:] for subject in info.state.subjects or {})


async def _bucket(
    js: JetStreamContext, settings: BrokerSettings, config: KeyValueConfig
) -> KeyValue:
    return await settings.call_retry.call(
        lambda: _create_or_share(
            lambda: js.create_key_value(config), lambda: js.key_value(config.bucket), config.bucket
        ),
        what=f"create bucket {config.bucket}",
    )


async def _create_or_share(
    create: Callable[[], Awaitable[T]], existing: Callable[[], Awaitable[T]], name: str
) -> T:
    """Create a bucket or store; one made by another process with other settings is shared."""
    try:
        return await create()
    except PermissionDenied:
        # This user may only use it (auth on): the operator created it.
        log.debug("not allowed to create bucket=%s; using the existing one", name)
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != ERR_CODE_EXISTS_DIFFERENT:
            raise
        # Say a longer node TTL, or defaults the server filled in: theirs is as good.
        log.info("bucket exists with a different config bucket=%s", name)
    return await existing()


def _plain_bucket(settings: BrokerSettings, name: str) -> KeyValueConfig:
    """A bucket keeping the last value of each key, on disk, readable by direct get."""
    # Direct gets name the key in the API subject, so auth can grant a tenant its own keys.
    return KeyValueConfig(
        bucket=name, history=1, storage=StorageType.FILE, replicas=settings.replicas, direct=True
    )


def jobs_stream_config(settings: BrokerSettings) -> StreamConfig:
    """The jobs bucket's stream: nats-py's KV layout, history 1, but no rollup headers.

    Tenants publish their own keys of this shared bucket directly; a stream taking rollup
    headers would let any of them purge every tenant's keys with one `Nats-Rollup: all`.
    Nothing purges this bucket through KV (`rm` uses the stream purge API as the operator).
    Per-message TTLs are on: a job's heartbeat key expires when its driver stops beating
    (coordinator/jobs/driver.py).
    """
    s = settings.subjects
    bucket = s.jobs_bucket()
    return StreamConfig(
        name=s.kv_stream(bucket),
        subjects=[s.kv_subjects(bucket)],
        max_msgs_per_subject=1,
        allow_direct=True,
        allow_rollup_hdrs=False,
        allow_msg_ttl=True,
        deny_delete=True,
        discard=DiscardPolicy.NEW,
        storage=StorageType.FILE,
        num_replicas=settings.replicas,
        duplicate_window=DUPLICATE_WINDOW_S,
    )


async def jobs_bucket(js: JetStreamContext, settings: BrokerSettings) -> KeyValue:
    """The job-spec bucket (`<tenant>.<job>` keys), on a stream refusing rollups."""
    config = jobs_stream_config(settings)
    bucket = settings.subjects.jobs_bucket()
    return await settings.call_retry.call(
        lambda: _create_or_share(
            lambda: _jobs_stream_once(js, config, bucket), lambda: js.key_value(bucket), bucket
        ),
        what=f"create bucket {bucket}",
    )


async def put_jobs_key(
    js: JetStreamContext, settings: BrokerSettings, subject: str, data: bytes
) -> None:
    """Publish a key of the jobs bucket (its KV subject); the bucket is made if it is gone.

    The bucket is made (or checked) once at connect; making sure of it before every job's
    spec cost two requests a job. A publish no stream takes says it went missing since
    (an operator deleted it): it is made again where this login may, and the key published
    once more.
    """
    with nats_errors():
        try:
            await js.publish(subject, data)
        except nats.js.errors.NoStreamResponseError:
            log.info("no stream took a jobs key; making the jobs bucket subject=%s", subject)
            with contextlib.suppress(PermissionDenied):
                # With auth on, the operator made the bucket and a tenant may not look at it.
                await jobs_bucket(js, settings)
            await js.publish(subject, data)


async def _jobs_stream_once(js: JetStreamContext, config: StreamConfig, bucket: str) -> KeyValue:
    try:
        await js.add_stream(config)
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != ERR_CODE_EXISTS_DIFFERENT:
            raise
        # Made by an older version, which took rollups and no per-message TTLs: turn rollups
        # off and TTLs on (the operator can).
        info = await js.stream_info(str(config.name))
        if info.config.allow_rollup_hdrs or not info.config.allow_msg_ttl:
            log.warning("turning off rollups and on message TTLs on stream=%s", config.name)
            await js.update_stream(info.config.evolve(allow_rollup_hdrs=False, allow_msg_ttl=True))
    return await js.key_value(bucket)


async def kernels_store(js: JetStreamContext, settings: BrokerSettings, tenant: str) -> ObjectStore:
    """One tenant's store of uploaded code (names are sha256 digests)."""
    return await _object_store(js, settings, settings.subjects.kernels_store(tenant))


async def outputs_store(js: JetStreamContext, settings: BrokerSettings, tenant: str) -> ObjectStore:
    """One tenant's store of chunk outputs too large to travel inside a result."""
    return await _object_store(js, settings, settings.subjects.outputs_store(tenant))


async def checkpoints_bucket(js: JetStreamContext, settings: BrokerSettings) -> KeyValue:
    """The checkpoints bucket (`<tenant>.<job>.<chunk>` keys, deleted with the result)."""
    name = settings.subjects.checkpoints_bucket()
    return await _bucket(js, settings, _plain_bucket(settings, name))


async def _object_store(js: JetStreamContext, settings: BrokerSettings, name: str) -> ObjectStore:
    config = ObjectStoreConfig(bucket=name, storage=StorageType.FILE, replicas=settings.replicas)
    return await settings.call_retry.call(
        lambda: _create_or_share(
            # nats-py overwrites config.bucket with its `bucket` argument: pass both.
            lambda: js.create_object_store(bucket=name, config=config),
            lambda: js.object_store(name),
            name,
        ),
        what=f"create object store {name}",
    )


async def quota_bucket(js: JetStreamContext, settings: BrokerSettings) -> KeyValue:
    """The quota bucket (`<tenant>` keys): nodes reserve a tenant's quota in it by CAS."""
    name = settings.subjects.quota_bucket()
    return await _bucket(js, settings, _plain_bucket(settings, name))
