"""Reading an object-store object by direct gets: what crosses from one account to another.

nats-py's `ObjectStore.get` reads an object's chunks through an ordered push consumer, whose
deliveries stay in the account that owns the store. With auth on, workers read a tenant's
uploaded code from the tenant's account through the direct gets that account exports
(broker/auth.py), so they read objects here: the meta by its subject, then each chunk with
`next_by_subj`, one request each, all answered to the asker's own inbox.
"""

from __future__ import annotations

import base64
import hashlib
import json

import nats.js.errors
from nats.js import JetStreamContext

from .errors import nats_errors
from .subjects import Subjects


async def read_object(js: JetStreamContext, bucket: str, name: str) -> bytes | None:
    """The object's bytes, or None if the store holds no such (undeleted) object.

    Raises:
        ValueError: the chunks do not add up to the size or digest the meta records.
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
        chunk_subject = Subjects.object_chunks(bucket, str(info["nuid"]))
        parts: list[bytes] = []
        seq = 1
        for _ in range(int(info.get("chunks") or 0)):
            msg = await js.get_msg(stream, seq=seq, subject=chunk_subject, next=True, direct=True)
            parts.append(msg.data or b"")
            seq = int(msg.seq or 0) + 1
    data = b"".join(parts)
    if len(data) != int(info.get("size") or 0):
        raise ValueError(f"object {name} in {bucket}: {len(data)} bytes, meta says {info['size']}")
    digest = str(info.get("digest") or "")
    if digest.startswith("SHA-256="):
        want = base64.urlsafe_b64decode(digest.removeprefix("SHA-256="))
        if hashlib.sha256(data).digest() != want:
            raise ValueError(f"object {name} in {bucket} does not match its recorded digest")
    return data
