"""ChunkStore: a node's checkpoints and large outputs, kept in JetStream for each chunk.

Checkpoints live in the `vf_checkpoints` bucket under `<tenant>.<job>.<chunk>`; a chunk that
is delivered again gets the last one back, and it is deleted once the chunk's result is
stored. Outputs too large to travel inside a result go to the tenant's outputs object store
as `<job>.<chunk>`, and the result names the object.
"""

from __future__ import annotations

import json
import logging

import attrs
import nats.js.errors
from nats.js.api import ObjectInfo
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from vramfabric.broker import buckets
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import nats_errors
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.subjects import Subjects

log = logging.getLogger(__name__)


class PutOnlyStore(ObjectStore):
    """nats-py's object store, looking an object's meta up by direct get of its subject.

    `put` reads the name's current meta (to purge the chunks it replaces); nats-py does that
    with a message get, whose grant would read any chunk of the store. The workers' user is
    only granted direct gets of meta subjects (broker/auth.py), so it cannot read outputs.
    """

    async def get_info(self, name: str, show_deleted: bool | None = False) -> ObjectInfo:
        """The object's meta; ObjectNotFoundError if there is none (or it is deleted)."""
        meta = Subjects.object_meta(self._name, name)
        try:
            msg = await self._js.get_msg(self._stream, subject=meta, direct=True)
        except nats.js.errors.NotFoundError:
            raise nats.js.errors.ObjectNotFoundError from None
        info: ObjectInfo = ObjectInfo.from_response(json.loads(msg.data or b"{}"))
        if not show_deleted and info.deleted:
            raise nats.js.errors.ObjectNotFoundError
        return info


@attrs.define
class ChunkStore:
    """Checkpoints and outputs of chunks, for one node."""

    conn: Connection
    broker: BrokerSettings
    _checkpoints: KeyValue | None = attrs.field(default=None, init=False)
    _outputs: dict[str, ObjectStore] = attrs.field(factory=dict, init=False)

    async def _bucket(self) -> KeyValue:
        if self._checkpoints is None:
            self._checkpoints = await buckets.checkpoints_bucket(self.conn.js, self.broker)
        return self._checkpoints

    def _key(self, tenant: str, job: str, index: int) -> str:
        return self.broker.subjects.checkpoint_key(tenant, job, index)

    async def load_checkpoint(self, tenant: str, job: str, index: int) -> bytes | None:
        """The chunk's last checkpoint, or None."""
        kv = await self._bucket()
        with nats_errors():
            try:
                entry = await kv.get(self._key(tenant, job, index))
            except nats.js.errors.NotFoundError:
                return None
        return entry.value or None

    async def save_checkpoint(self, tenant: str, job: str, index: int, state: bytes) -> None:
        """Store the chunk's checkpoint (replacing the last one)."""
        kv = await self._bucket()
        with nats_errors():
            await kv.put(self._key(tenant, job, index), state)

    async def delete_checkpoint(self, tenant: str, job: str, index: int) -> None:
        """Forget the chunk's checkpoints (its result is stored)."""
        kv = await self._bucket()
        with nats_errors():
            await kv.purge(self._key(tenant, job, index))

    async def put_output(self, tenant: str, job: str, index: int, output: bytes) -> str:
        """Store a large output; return the object's name."""
        name = self.broker.subjects.output_object(job, index)
        store = self._outputs.get(tenant)
        if store is None:
            bucket = self.broker.subjects.outputs_store(tenant)
            if not self.broker.accounts:
                # With auth on it is in the tenant's account, provisioned by the operator.
                await buckets.outputs_store(self.conn.js, self.broker, tenant)
            js = self.conn.tenant_js(tenant)
            store = PutOnlyStore(
                name=bucket, stream=self.broker.subjects.object_stream(bucket), js=js
            )
            self._outputs[tenant] = store
        with nats_errors():
            await store.put(name, output)
        return name
