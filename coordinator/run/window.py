"""Window: a run's chunks submitted and not yet finished, within a count and a byte limit.

The submitter publishes in batches (`BATCH_CHUNKS`, `BATCH_BYTES`) and is woken only once a
batch's worth of places is free again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import attrs

from .packing import SPREAD_MIN_CHUNKS

# A batch is published (and its PubAcks awaited) once it holds this many chunks or bytes.
BATCH_CHUNKS = 1000
BATCH_BYTES = 8 * 2**20


@attrs.define
class Window:
    """Chunks submitted and not yet finished, at most `max_chunks` of them and `max_bytes`.

    A pack of more than SPREAD_MIN_CHUNKS chunks counts as that many against `max_chunks`
    (`chunk_limit`): the window holds as many big packs in flight as it did of packs of
    1,000, the most a pack held before nodes took more.
    """

    max_chunks: int
    max_bytes: int
    # Chunks per message as of the last batch published (Packer.pack_size; set by the
    # submission, not asked per chunk).
    pack_size: int = 1
    _inflight: dict[int, int] = attrs.field(factory=dict, init=False)  # index -> input bytes
    _bytes: int = attrs.field(default=0, init=False)
    _room: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _freed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)  # any place freed
    # The submitter is woken only once a batch's worth is free (at most this many chunks and
    # bytes in flight), so it publishes batches rather than one chunk per freed place.
    _refill_bytes: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        """The bytes' refill mark, from the limit (a result of each chunk checks it)."""
        self._refill_bytes = self.max_bytes - min(BATCH_BYTES, self.max_bytes // 4)

    def chunk_limit(self) -> int:
        """The chunks that may be in flight now: `max_chunks`, scaled for big packs."""
        return self.max_chunks * max(1, self.pack_size // SPREAD_MIN_CHUNKS)

    def __len__(self) -> int:
        return len(self._inflight)

    def fits(self, size: int) -> bool:
        """Whether a chunk of `size` bytes may go out now (an empty window takes any one)."""
        if not self._inflight:
            return True
        return len(self._inflight) < self.chunk_limit() and self._bytes + size <= self.max_bytes

    def add(self, index: int, size: int) -> None:
        """Count chunk `index` as in flight."""
        self._inflight[index] = size
        self._bytes += size

    def fits_run(self, n_chunks: int, n_bytes: int) -> bool:
        """Whether `n_chunks` chunks of `n_bytes` in all may go out now, within both limits."""
        fits_chunks = len(self._inflight) + n_chunks <= self.chunk_limit()
        return fits_chunks and self._bytes + n_bytes <= self.max_bytes

    def add_run(self, first: int, sizes: list[int]) -> None:
        """Count chunks `first`, `first + 1`, ... of input `sizes` as in flight."""
        self._inflight.update(zip(range(first, first + len(sizes)), sizes, strict=True))
        self._bytes += sum(sizes)

    def finished(self, index: int) -> None:
        """Chunk `index` has a result: free its place (nothing if it was not in flight)."""
        self.finished_run(index, 1)

    def finished_run(self, first: int, n: int) -> None:
        """Chunks `first` .. `first + n - 1` have results: free the places of those in flight."""
        before = len(self._inflight)
        # map over two iterables: no Python call per chunk (a listcomp's was a twentieth of a
        # job of tiny chunks' coordinator CPU).
        freed = sum(map(self._inflight.pop, range(first, first + n), itertools.repeat(0, n)))
        if len(self._inflight) == before:
            return
        self._bytes -= freed
        self._freed.set()
        limit = self.chunk_limit()
        refill_chunks = limit - max(1, min(BATCH_CHUNKS, limit // 4))
        if len(self._inflight) <= refill_chunks and self._bytes <= self._refill_bytes:
            self._room.set()

    async def wait_below(self, n_chunks: int, timeout_s: float | None = None) -> None:
        """Wait until fewer than `n_chunks` chunks are in flight, or `timeout_s` passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while len(self._inflight) >= n_chunks:
                    self._freed.clear()
                    await self._freed.wait()

    async def wait_room(self, size: int) -> None:
        """Wait until a chunk of `size` bytes fits."""
        while not self.fits(size):
            self._room.clear()
            await self._room.wait()
