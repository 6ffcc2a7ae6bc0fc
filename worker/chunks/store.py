"""ChunkStore: a node's checkpoints and large outputs, kept in JetStream for each chunk.

Checkpoints live in the `vf_checkpoints` bucket under `<tenant>.<job>.<chunk>`; a chunk that
is delivered again gets the last one back, and it is deleted once the chunk's result is
stored. Outputs too large to travel inside a result go to the tenant's outputs object store
as `<job>.<chunk>`, and the result names the object. An interactive call's input too large
for its request is read from the tenant's kernels store, where the caller put it.
"""

from __future__ import annotations

import logging

import attrs
import nats.js.errors
from nats.js.kv import KeyValue

from vramfabric.broker import buckets
from vramfabric.broker.calls import MAX_CALL_INPUT_BYTES
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import ChunkFailed, ErrorKind, nats_errors
from vramfabric.broker.objects import chunk_bytes_for, read_written_object, write_object
from vramfabric.broker.settings import BrokerSettings

log = logging.getLogger(__name__)


@attrs.define
class ChunkStore:
    """Checkpoints and outputs of chunks, and large call inputs, for one node."""

    conn: Connection
    broker: BrokerSettings
    _checkpoints: KeyValue | None = attrs.field(default=None, init=False)
    # Tenants whose outputs store is known to exist (made by this node without auth).
    _outputs: set[str] = attrs.field(factory=set, init=False)

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
        bucket = self.broker.subjects.outputs_store(tenant)
        if tenant not in self._outputs and not self.broker.accounts:
            # With auth on it is in the tenant's account, provisioned by the operator.
            await buckets.outputs_store(self.conn.js, self.broker, tenant)
        self._outputs.add(tenant)
        # Through what the tenant's account exports to the workers: chunk and meta publishes
        # and direct gets of meta subjects only, so the workers' user can neither read outputs
        # back nor purge them (a replaced object's chunks are left: broker/objects.py).
        js = self.conn.tenant_js(tenant)
        await write_object(js, bucket, name, output, chunk_bytes_for(self.conn.nc.max_payload))
        return name

    async def call_input(self, tenant: str, name: str) -> bytes:
        """A call's input that its caller put in the tenant's kernels store (broker/calls.py).

        Raises:
            ChunkFailed: no such object, or one over MAX_CALL_INPUT_BYTES (left unread) or
                not what its meta records.
        """
        bucket = self.broker.subjects.kernels_store(tenant)
        js, retry = self.conn.tenant_js(tenant), self.broker.call_retry
        try:
            data = await read_written_object(js, retry, bucket, name, MAX_CALL_INPUT_BYTES)
        except ValueError as exc:
            raise ChunkFailed(ErrorKind.INVALID_MESSAGE, f"call input: {exc}") from None
        if data is None:
            raise ChunkFailed(ErrorKind.INVALID_MESSAGE, f"call input {name} is not in {bucket}")
        return data
