"""Windowed submission: a job's inputs read lazily, at most a window of chunks in flight.

The coordinator reads a job's inputs one at a time, skips chunks that already have a result,
and publishes the others in batches, never holding more than `submit_window` chunks (or
`submit_window_bytes` of input) submitted but without a result. Each folded result frees its
chunk's place, so results are folded long before the last input is read, and neither the
coordinator's memory nor the work stream grows with the number of chunks. A batch goes out
as single chunks or packs of tiny ones (packing.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection

import attrs

from vramfabric.broker.acked import AckedPublisher
from vramfabric.broker.connection import Connection
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.settings import BrokerSettings

from ..jobs.job import BLOCK_CHUNKS, InputsDigest, Job, blocks
from ..jobs.publish import PUBLISH_ACK_WAIT_S, submit_chunks
from .packing import PROBE_WAIT_S, Packer
from .results import ResultsConsumer
from .window import BATCH_BYTES, BATCH_CHUNKS, Window

log = logging.getLogger(__name__)


@attrs.define
class Submission:
    """One run's pass over a job's inputs: skip what has a result, publish the rest."""

    conn: Connection
    broker: BrokerSettings
    spec: JobSpec
    job: Job
    window: Window
    results: ResultsConsumer
    # Chunks with a stored result before the run, and those reopened by `retry_failed`.
    done: Collection[int]
    retried: Collection[int]
    # Chunks an earlier run left queued: they run from the queue under this run's leases. Sent
    # again they would run twice wherever this run packs them otherwise (another message id).
    queued: Collection[int]
    limit: int
    # Awaited once, before the first chunk is published (leasing, the job's consumer).
    before_first: Callable[[], Awaitable[None]]
    packer: Packer
    # How many leases the job holds now (the packer's probe sends one chunk per lease).
    leases: Callable[[], int]
    rerun: str = ""
    n_submitted: int = attrs.field(default=0, init=False)
    digest: InputsDigest = attrs.field(factory=InputsDigest, init=False)
    _batch: dict[int, bytes] = attrs.field(factory=dict, init=False)
    _batch_bytes: int = attrs.field(default=0, init=False)
    # Chunks a batch holds at most: BATCH_CHUNKS, or a whole pack where packs are bigger (set at
    # each flush: the pack size is not asked per chunk).
    _batch_max: int = attrs.field(default=BATCH_CHUNKS, init=False)
    _acks: AckedPublisher | None = attrs.field(default=None, init=False)

    async def run(self) -> int:
        """Publish every chunk still to do; return how many inputs the job has.

        Raises:
            ValueError: a streamed job with no inputs, or an input over the size limit.
            TypeError: an input that cannot be encoded for the job's work.
            Disconnected, PermanentError: chunks could not be published (see submit_chunks).
        """
        streamed, n_read = self.job.streamed, 0
        kept = None if streamed else self.job.take_encoded(self.limit)
        # A generator's inputs are read one at a time: it may yield them as they come.
        try:
            for first, values in blocks(self.job.inputs, 1 if streamed else BLOCK_CHUNKS):
                n_read = first + len(values)
                if self.fresh(first, len(values)):
                    encoded = _kept_block(kept, first, len(values)) or self.job.encode_many(
                        first, values, self.limit
                    )
                    if streamed:
                        self.digest.add_many(encoded)
                    await self._submit_run(first, encoded)
                    continue
                for index, value in enumerate(values, first):
                    # A chunk reopened with its pack is submitted again even if its result is in.
                    skip = index not in self.retried and (
                        index in self.done or index in self.queued or self.results.seen(index)
                    )
                    # A streamed job's digest covers every input; a sized one's is known.
                    data = (
                        self.job.encode(index, value, self.limit) if streamed or not skip else b""
                    )
                    if streamed:
                        self.digest.add(data)
                    if not skip and not self._added(index, data):
                        await self._add(index, data)
            await self._flush()
            if self.queued and self._acks is None:
                await self._start_publishing()  # nothing new, but the queued chunks need leases
        finally:
            if self._acks is not None:
                await self._acks.stop()
        if not n_read:
            raise ValueError("a job needs at least one chunk input")
        return n_read

    def fresh(self, first: int, n: int) -> bool:
        """Whether chunks `first` .. `first + n - 1` are all to be sent, none reopened."""
        if self.retried or self.done or self.queued:
            return False
        return self.results.fresh(first, n)

    async def _submit_run(self, first: int, encoded: list[bytes]) -> None:
        """Submit fresh chunks `first`, `first + 1`, ...: as many at once as fit, else alone."""
        i, n = 0, len(encoded)
        while i < n:
            k = self._added_run(first + i, encoded, i)
            if k:
                i += k
                continue
            if not self._added(first + i, encoded[i]):
                await self._add(first + i, encoded[i])
            i += 1

    def _added_run(self, first: int, encoded: list[bytes], start: int) -> int:
        """Add `encoded[start:]`'s chunks (from `first`) that fit at once to the batch; how many.

        As `_added` would each, in one go: none if the first chunk must wait for anything.
        """
        if not self.packer.unthrottled:
            return 0
        room = self._batch_max - 1 - len(self._batch)
        k = min(len(encoded) - start, room, self.window.chunk_limit() - len(self.window))
        if k <= 0:
            return 0
        data = encoded[start : start + k]
        sizes = list(map(len, data))
        n_bytes = sum(sizes)
        if self._batch_bytes + n_bytes >= BATCH_BYTES or not self.window.fits_run(k, n_bytes):
            return 0
        self.window.add_run(first, sizes)
        self._batch.update(zip(range(first, first + k), data, strict=True))
        self._batch_bytes += n_bytes
        return k

    def _added(self, index: int, data: bytes) -> bool:
        """Add the chunk to the batch if nothing is to be awaited before or after; True if so.

        Most chunks of a job go this way: with `_add` awaited for each, reading a job's 996
        chunks after its probe took 5.2 ms instead of 4.3 ms, while the workers waited.
        """
        size = len(data)
        if (
            not self.packer.unthrottled
            or self.results.seen(index)
            or not self.window.fits(size)
            or len(self._batch) + 1 >= self._batch_max
            or self._batch_bytes + size >= BATCH_BYTES
        ):
            return False
        self.window.add(index, size)
        self._batch[index] = data
        self._batch_bytes += size
        return True

    async def _add(self, index: int, data: bytes) -> None:
        if self.results.seen(index):
            # Reopened with its pack, its result already folded: no result of it will free
            # a place in the window, so it takes none (its bytes count in the batch's).
            self._batch[index] = data
            self._batch_bytes += len(data)
            return
        if not self.window.fits(len(data)):
            await self._flush()  # its chunks count against the window: publish them first
            await self.window.wait_room(len(data))
        cap = self.packer.throttle(self.leases(), time.monotonic())
        if cap is not None and len(self.window) >= cap:
            # Chunk speed unknown: a few go out alone until results say whether to pack
            # (while none has come, the cap grows with time: wait for the next step too).
            await self._flush()
            await self.window.wait_below(cap, PROBE_WAIT_S if self.packer.probing else None)
        self.window.add(index, len(data))
        self._batch[index] = data
        self._batch_bytes += len(data)
        if len(self._batch) >= self._batch_max or self._batch_bytes >= BATCH_BYTES:
            await self._flush()

    async def _flush(self) -> None:
        """Publish the batch, packed as the packer says, and await its PubAcks."""
        if not self._batch:
            return
        acks = self._acks or await self._start_publishing()
        batch, n_bytes = self._batch, self._batch_bytes
        self._batch, self._batch_bytes = {}, 0
        self.window.pack_size = self.packer.pack_size()
        self._batch_max = max(BATCH_CHUNKS, self.window.pack_size)
        indices = list(batch)
        again = [i for i in indices if i in self.retried] if self.retried else []
        plain = [i for i in indices if i not in self.retried] if again else indices
        for chunks, rerun in ((plain, ""), (again, self.rerun)):
            if chunks:
                spans = self.packer.spans(chunks, batch, n_bytes)
                await submit_chunks(self.conn, self.broker, self.spec, batch, spans, rerun, acks)
        self.n_submitted += len(indices)

    async def _start_publishing(self) -> AckedPublisher:
        """Lease (`before_first`) and start the publisher, before the first chunk goes out."""
        await self.before_first()
        self._acks = await AckedPublisher(self.conn.nc, PUBLISH_ACK_WAIT_S).start()
        return self._acks


def _kept_block(kept: list[list[bytes]] | None, first: int, n: int) -> list[bytes] | None:
    """The block of `n` inputs from `first` that the job's spec encoded, if it kept it."""
    k = first // BLOCK_CHUNKS
    if kept is None or k >= len(kept) or len(kept[k]) != n:
        return None
    return kept[k]
