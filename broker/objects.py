"""Objects of an object store, written and read at loopback speed, in nats-py's format.

nats-py's `ObjectStore.get` reads through an ordered push consumer. That consumer can take
its first message before nats-py has set up its sequence tracking: the next message then
looks like a gap, the consumer restarts from the first chunk, and the first chunk, already
queued, is read twice (`DigestMismatchError` on first read, the object intact; seen on 4 of
6 outputs of 300 KiB read at once). It also needs flow-control replies (a publish grant),
and without `writeinto` it grows one `bytes` per chunk (quadratic). Its `put` awaits each
128 KiB chunk's acknowledgement before sending the next.

Here an object is read with batched direct gets (one request per `_READ_BATCH` chunks, the
answers to the asker's own inbox, no consumer) into a buffer of the size the meta records,
and written with chunks as large as the server's max payload allows, a window of them
in flight. The format is nats-py's (meta JSON, chunk subject by nuid, SHA-256 digest), so
either side may be nats-py's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
from datetime import UTC, datetime
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.nuid import NUID

from .errors import PermissionDenied, StaleRead, nats_errors
from .retrying import CallRetry
from .subjects import Subjects

log = logging.getLogger(__name__)

# Chunks asked for in one direct-get request: 16 MiB of 1 MiB chunks a round trip.
_READ_BATCH = 16
# Chunk publishes awaiting their acknowledgement at once while an object is written.
_WRITE_WINDOW = 8
# Room left in a chunk for the message's protocol line under the server's max payload.
_CHUNK_MARGIN_BYTES = 4096
# The largest chunk written, whatever the server allows (a chunk is one message in memory).
MAX_CHUNK_BYTES = 8 * 2**20
# The smallest chunk written (`chunk_bytes_for`): a bounded read refuses an object whose meta
# records more chunks than its size allows at this size (each costs the reader a message).
MIN_CHUNK_BYTES = 4096
# How long one batch of chunks or one acknowledgement may take before the call fails.
_WAIT_S = 30.0


def chunk_bytes_for(max_payload_bytes: int) -> int:
    """The chunk size to write objects with, under a server's max payload."""
    return max(MIN_CHUNK_BYTES, min(MAX_CHUNK_BYTES, max_payload_bytes - _CHUNK_MARGIN_BYTES))


async def read_object(
    js: JetStreamContext, bucket: str, name: str, max_bytes: int | None = None
) -> bytes | None:
    """The object's bytes, or None if the store holds no such (undeleted) object.

    Raises:
        ValueError: the chunks do not add up to the size or digest the meta records, or the
            meta records more than `max_bytes`, or more chunks than its size allows (nothing
            of it is read then).
        StaleRead: fewer chunks are stored than the meta records (a replica behind).
        TransientError: a batch of chunks did not come in time.
    """
    stream = Subjects.object_stream(bucket)
    with nats_errors():
        try:
            meta = await js.get_msg(stream, subject=Subjects.object_meta(bucket, name), direct=True)
        except nats.js.errors.NotFoundError:
            return None
        info = json.loads(meta.data or b"{}")
        if info.get("deleted") or not info.get("nuid"):
            return None
        size, n_chunks = int(info.get("size") or 0), int(info.get("chunks") or 0)
        if max_bytes is not None and size > max_bytes:
            raise ValueError(f"object {name} in {bucket} is {size} bytes; at most {max_bytes}")
        if max_bytes is not None and n_chunks > size // MIN_CHUNK_BYTES + 1:
            raise ValueError(f"object {name} in {bucket}: {n_chunks} chunks for {size} bytes")
        chunks = Subjects.object_chunks(bucket, str(info["nuid"]))
        data = await _read_chunks(js, stream, chunks, size, n_chunks)
    digest = str(info.get("digest") or "")
    if digest.startswith("SHA-256="):
        want = base64.urlsafe_b64decode(digest.removeprefix("SHA-256="))
        if hashlib.sha256(data).digest() != want:
            raise ValueError(f"object {name} in {bucket} does not match its recorded digest")
    return data


async def read_written_object(
    js: JetStreamContext, retry: CallRetry, bucket: str, name: str, max_bytes: int | None = None
) -> bytes | None:
    """An object a message says was written; None if it is still absent at `retry`'s deadline.

    Any replica answers a direct get, and a follower may not yet hold what the leader has
    acknowledged to the writer: an object absent, or short of its chunks, is read again.

    Raises:
        ValueError: the chunks do not add up to the size or digest the meta records, or it
            is over `max_bytes`.
    """

    async def present() -> bytes:
        data = await read_object(js, bucket, name, max_bytes)
        if data is None:
            raise StaleRead(f"no object {name} in {bucket}")
        return data

    try:
        return await retry.call(present, what=f"read object {name}")
    except StaleRead:
        return None


async def _read_chunks(
    js: JetStreamContext, stream: str, subject: str, size: int, n_chunks: int
) -> bytes:
    """The `n_chunks` messages on `subject`, in stream order, laid end to end."""
    # Joined once at the end: one copy of the whole (a copy of 64 MiB costs 0.1 s here).
    parts: list[bytes] = []
    at, got, seq = 0, 0, 1
    nc = js._nc  # nats-py keeps the connection private; the API prefix too (below)
    inbox = nc.new_inbox()
    answers: asyncio.Queue[Msg] = asyncio.Queue()
    sub = await nc.subscribe(
        inbox, cb=_put_into(answers), pending_bytes_limit=2 * _READ_BATCH * MAX_CHUNK_BYTES
    )
    request = Subjects.direct_get(js._prefix, stream)
    try:
        while got < n_chunks:
            batch = min(_READ_BATCH, n_chunks - got)
            body = {"seq": seq, "next_by_subj": subject, "batch": batch}
            await nc.publish(request, json.dumps(body).encode(), reply=inbox)
            before = got
            while True:
                msg = await asyncio.wait_for(answers.get(), _WAIT_S)
                headers = msg.headers or {}
                status = headers.get("Status")
                if status == "204":  # end of this batch
                    break
                if status:
                    raise nats.js.errors.APIError(
                        code=int(status), description=headers.get("Description", "")
                    )
                chunk = msg.data or b""
                if at + len(chunk) > size:
                    raise ValueError(f"object chunks on {subject} exceed its size {size}")
                parts.append(chunk)
                at, got = at + len(chunk), got + 1
                seq = int(headers["Nats-Sequence"]) + 1
            if got == before:  # the stream holds fewer chunks than the meta says
                break
    finally:
        with contextlib.suppress(Exception):  # the connection may be gone; nothing to undo
            await sub.unsubscribe()
    if got < n_chunks:  # a replica behind the writer: read_written_object asks again
        raise StaleRead(f"object on {subject}: {got} of {n_chunks} chunks stored")
    if at != size or got != n_chunks:
        raise ValueError(f"object on {subject}: {at} bytes in {got} chunks, meta says {size}")
    return b"".join(parts)


def _put_into(queue: asyncio.Queue[Msg]) -> Any:
    async def put(msg: Msg) -> None:
        queue.put_nowait(msg)

    return put


async def write_object(
    js: JetStreamContext, bucket: str, name: str, data: bytes, chunk_bytes: int
) -> None:
    """Store `data` as object `name` of `bucket`, replacing any earlier one.

    The earlier one's chunks are purged where the caller may purge (a tenant); a workers'
    user may not, and leaves them behind, never read as the object again.

    Raises:
        VramfabricError: a chunk or the meta was not stored (the chunks written are purged).
    """
    stream = Subjects.object_stream(bucket)
    nuid = NUID().next().decode()
    chunks = Subjects.object_chunks(bucket, nuid)
    meta_subject = Subjects.object_meta(bucket, name)
    with nats_errors():
        try:
            earlier = await js.get_msg(stream, subject=meta_subject, direct=True)
            earlier_nuid = json.loads(earlier.data or b"{}").get("nuid")
        except nats.js.errors.NotFoundError:
            earlier_nuid = None
        try:
            digest, n_chunks = await _write_chunks(js, chunks, data, chunk_bytes)
            info = {
                "name": name,
                "bucket": bucket,
                "nuid": nuid,
                "size": len(data),
                "mtime": datetime.now(UTC).isoformat(),
                "chunks": n_chunks,
                "digest": "SHA-256=" + base64.urlsafe_b64encode(digest).decode(),
                "options": {"max_chunk_size": chunk_bytes},
            }
            # The meta replaces the name's earlier meta (a rollup of its subject).
            await js.publish(
                meta_subject, json.dumps(info).encode(), headers={"Nats-Rollup": "sub"}
            )
        except BaseException:  # re-raised: the chunks written so far are purged first
            with contextlib.suppress(Exception):  # best effort: the error below is what counts
                await js.purge_stream(stream, subject=chunks)
            raise
        if earlier_nuid and earlier_nuid != nuid:
            try:
                with nats_errors():
                    earlier_chunks = Subjects.object_chunks(bucket, earlier_nuid)
                    await js.purge_stream(stream, subject=earlier_chunks)
            except PermissionDenied:
                # The workers' user may not purge a tenant's store (broker/auth.py): the
                # earlier chunks stay, unreadable as the object (its meta names the new
                # nuid), counted in the tenant's storage until the store is purged.
                log.info("earlier chunks of %s left in %s (no purge right)", name, bucket)


async def purge_object(js: JetStreamContext, bucket: str, name: str) -> None:
    """Remove object `name` of `bucket`, chunks and meta, leaving no delete marker behind.

    nats-py's `delete` keeps a marker per name for watchers (none here): an object made
    per call and deleted after it would leave one for every call. Nothing if it is absent.

    Raises:
        VramfabricError: the stream refused (a workers' user may not purge: broker/auth.py).
    """
    stream = Subjects.object_stream(bucket)
    meta_subject = Subjects.object_meta(bucket, name)
    with nats_errors():
        try:
            meta = await js.get_msg(stream, subject=meta_subject, direct=True)
        except nats.js.errors.NotFoundError:
            return
        nuid = json.loads(meta.data or b"{}").get("nuid")
        if nuid:  # the chunks first: a meta left alone reads as an object short of chunks
            await js.purge_stream(stream, subject=Subjects.object_chunks(bucket, str(nuid)))
        await js.purge_stream(stream, subject=meta_subject)


async def _write_chunks(
    js: JetStreamContext, subject: str, data: bytes, chunk_bytes: int
) -> tuple[bytes, int]:
    """Publish `data` in chunks on `subject`, in order; (SHA-256, chunk count)."""
    view, digest = memoryview(data), hashlib.sha256()
    pending: list[asyncio.Future[Any]] = []
    n_chunks = 0
    try:
        for at in range(0, len(data), chunk_bytes):
            chunk = view[at : at + chunk_bytes]
            digest.update(chunk)
            # Sent in call order on the one connection, so the stream keeps them in order;
            # each acknowledgement is awaited with a deadline (a refused publish_async never
            # resolves: nats.py #985).
            # A view, not a copy: nats-py copies it once into the protocol line anyway.
            pending.append(await js.publish_async(subject, chunk))  # type: ignore[arg-type]
            n_chunks += 1
            if len(pending) >= _WRITE_WINDOW:
                await asyncio.wait_for(pending.pop(0), _WAIT_S)
        for future in pending:
            await asyncio.wait_for(future, _WAIT_S)
    finally:
        for future in pending:
            future.cancel()
    return digest.digest(), n_chunks
