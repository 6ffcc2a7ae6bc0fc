"""Packing: how many tiny chunks travel in one message, from the chunks' sizes and speed.

A message costs the same whether its chunk runs for a microsecond or a minute, so a job of
tiny chunks is bound by the per-message cost. With `chunks_per_message` at 0 (auto, the
default) a job's first `PROBE_CHUNKS` chunks go one per message and the rest wait for their
first result, four times as many in flight every `PROBE_WAIT_S` without one, up to one per
lease; until results show whether chunks are tiny, one chunk per lease is in flight. How
long a chunk runs is the shortest run seen, in seconds of its executor thread (`cost_s`: not
counting the wait for an executor, and wall time, so a chunk that sleeps or waits for I/O is
never taken for a tiny one). Chunks that run under `TINY_CHUNK_S` then go in packs
(`ChunkPack`) of about `TARGET_PACK_S` of work, of contiguous chunks, at most
`PACK_INPUT_BYTES` of input, and never more chunks than `MAX_PACK_S` of the slowest chunk
seen. Only successful results count: a chunk that fails at once says nothing of how long
the others run. Once two rounds of results show longer chunks, they keep one message each
with the full window: a pack runs on one lease, one chunk after another, and long chunks
spread over the leases finish sooner. 1 turns packing off; N >= 2 packs up to N chunks from
the start. A job holds no more leases than it has messages left (`Packer.messages`): in
auto, its first leases wait up to `PROBE_LEASES_WAIT_S` for a first result before it asks
for more (coordinator/run/growth.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

import attrs

from vramfabric.broker.subjects import MAX_PACK_CHUNKS

from ..jobs.job import Span

# Chunks that run shorter than this (as results report them) are packed.
TINY_CHUNK_S = 0.005
# A pack holds about this much work: each message costs the fabric CPU whatever it holds
# (1,000 chunks of 0.2 ms on 2 cores, lease to release: 0.179 s in packs of 20 ms of work,
# 0.169 s of 40 ms, 0.165 s of 60 ms, alternated in one run) ...
TARGET_PACK_S = 0.05
# ... and never more chunks than this many seconds of the slowest chunk seen: a job of mostly
# tiny chunks and a few long ones (early stopping) does not line long ones up in a pack.
MAX_PACK_S = 1.0
# A pack's inputs at most (its message stays far below the server's 1 MiB payload).
PACK_INPUT_BYTES = 256 * 2**10
# Auto: a job's packs are at most 1/SPREAD_PACKS of its chunks, so they spread over its leases,
# but never under SPREAD_MIN_CHUNKS for that (packs held 1,000 at most before nodes took more).
# Per message each process pays the same whatever the pack holds (about 2.3 ms of CPU in all
# on 2 cores): 100,000 tiny chunks took 9.1 us of CPU a chunk in packs of 1,000, 6.7 us in
# packs of 5,000.
SPREAD_PACKS = 16
SPREAD_MIN_CHUNKS = 1000
# ... and past SPREAD_MIN_CHUNKS a pack's outputs (as results showed them) stay within this,
# or the worker would put those past its result's payload in the outputs store, one by one.
PACK_OUTPUT_BYTES = 256 * 2**10
# Auto: chunks sent alone before any result, four times as many every PROBE_WAIT_S without
# one. A tiny chunk's result comes back within milliseconds on a warm fleet; a job of long
# chunks on a large fleet fills its leases within 0.2 s, not after a whole chunk's
# run with most of them idle; and where a loaded machine is slow to return the first result,
# few tiny chunks go unpacked (opening every lease at once after 0.1 s, 1,000 chunks took
# 0.40 s beside Ray's busy processes; 0.16 s like this).
PROBE_CHUNKS = 4
PROBE_WAIT_S = 0.05
# Auto: how long a job's first leases wait for a first result before the rest are asked for
# as for long chunks (by then the probe keeps more chunks in flight than the first leases).
PROBE_LEASES_WAIT_S = 2 * PROBE_WAIT_S


@attrs.define
class ChunkSpeed:
    """How long a job's chunks run, as its results report it: the shortest seen per chunk."""

    chunk_s: float | None = None
    # The longest a chunk took (a pack's average for its chunks).
    slowest_s: float = 0.0
    n_results: int = 0
    # The most output bytes a chunk gave (a pack's average for its inline outputs).
    output_bytes: float = 0.0
    _first: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)

    def observe(self, elapsed_s: float, n_chunks: int = 1, output_bytes: int = 0) -> None:
        """Count a result of `n_chunks` chunks that ran `elapsed_s` on its node.

        `output_bytes`: what their inline outputs came to, together.
        """
        if elapsed_s <= 0 or n_chunks <= 0:
            return  # a result recorded by a coordinator, not run
        each = elapsed_s / n_chunks
        self.output_bytes = max(self.output_bytes, output_bytes / n_chunks)
        self.n_results += 1
        self._first.set()
        self.chunk_s = each if self.chunk_s is None else min(self.chunk_s, each)
        self.slowest_s = max(self.slowest_s, each)

    async def first(self, timeout_s: float) -> None:
        """Wait until a first result was seen, or `timeout_s` passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._first.wait()


@attrs.define
class Packer:
    """Cuts a batch of chunks into messages: packs of tiny chunks, single chunks otherwise."""

    # 0: auto; 1: one chunk per message; N: up to N chunks per message.
    chunks_per_message: int
    speed: ChunkSpeed
    # The most chunks every node that may take the job's chunks takes in a pack (1: one does
    # not run packs; NodeAdvert.packs and max_pack_chunks).
    pack_limit: Callable[[], int] = lambda: MAX_PACK_CHUNKS
    # The job's chunk count (a streamed job's spec says the most a job may have); 0: packs of
    # SPREAD_MIN_CHUNKS at most.
    n_chunks: int = 0
    # When the first chunks went out without a result to go by (monotonic seconds).
    _probe_started: float | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        """Refuse a negative setting."""
        if self.chunks_per_message < 0:
            raise ValueError(f"chunks_per_message must be >= 0, got {self.chunks_per_message}")

    @property
    def probing(self) -> bool:
        """Whether no result has told the chunks' speed yet (auto packing)."""
        return not self.chunks_per_message and not self.speed.n_results

    @property
    def unthrottled(self) -> bool:
        """Whether `throttle` says None for good: packing set, or the chunks seen to be tiny."""
        chunk_s = self.speed.chunk_s
        return bool(self.chunks_per_message) or (chunk_s is not None and chunk_s < TINY_CHUNK_S)

    def throttle(self, leases: int, now: float) -> int | None:
        """Chunks to keep in flight while deciding (auto, speed unknown); None: the window.

        Before any result, `PROBE_CHUNKS`, four times as many every `PROBE_WAIT_S` without
        one (at monotonic time `now`), up to one per lease: long chunks soon fill the leases,
        and where a tiny chunk's result is slow to come, few go out unpacked.
        """
        if self.chunks_per_message:
            return None
        chunk_s = self.speed.chunk_s
        if chunk_s is not None and chunk_s < TINY_CHUNK_S:
            return None  # tiny: packed from now on
        cap = max(PROBE_CHUNKS, leases)
        if self.probing:
            if self._probe_started is None:
                self._probe_started = now
            steps = int((now - self._probe_started) / PROBE_WAIT_S)
            return min(cap, PROBE_CHUNKS << min(2 * steps, 40))
        # Two rounds of results, none tiny: the chunks are long, send them as they are.
        return None if self.speed.n_results >= 2 * cap else cap

    def pack_size(self) -> int:
        """Chunks per message now."""
        limit = min(self.pack_limit(), MAX_PACK_CHUNKS)
        if self.chunks_per_message == 1 or limit <= 1:
            return 1
        if self.chunks_per_message:
            return min(self.chunks_per_message, limit)
        chunk_s = self.speed.chunk_s
        if chunk_s is None or chunk_s >= TINY_CHUNK_S:
            return 1
        spread = max(SPREAD_MIN_CHUNKS, -(-self.n_chunks // SPREAD_PACKS))
        fits = max(SPREAD_MIN_CHUNKS, PACK_OUTPUT_BYTES / max(self.speed.output_bytes, 1.0))
        size = min(limit, spread, fits, TARGET_PACK_S / max(chunk_s, 1e-6))
        return max(1, int(min(size, MAX_PACK_S / max(self.speed.slowest_s, 1e-6))))

    def messages(self, n_chunks: int) -> int:
        """How many messages `n_chunks` chunks go in at the pack size now (one each if unknown).

        A job holds no more leases than this: a pack runs on one lease, so leases beyond the
        packs left would idle while their grants and releases cost the nodes and the
        coordinator (1,000 tiny chunks on 320 leases: about 0.02 s of CPU a job on 2 cores).
        """
        return -(-n_chunks // self.pack_size())

    def spans(
        self, indices: list[int], inputs: Mapping[int, bytes], n_bytes: int | None = None
    ) -> list[Span]:
        """The batch's chunks (in order) as messages: runs of contiguous chunks, or one each.

        `n_bytes`: the batch's inputs' bytes together, if known (no pack's are counted then
        where all of them fit in one).
        """
        size = self.pack_size()
        if size == 1:
            return [(i, i) for i in indices]
        spans: list[Span] = []
        if indices and indices == list(range(indices[0], indices[0] + len(indices))):
            # Contiguous (a fresh job's batch): cut every `size`, while within the bytes.
            end = indices[-1] + 1
            fits = n_bytes is not None and n_bytes <= PACK_INPUT_BYTES
            for first in range(indices[0], end, size):
                last = min(first + size, end) - 1
                if not fits and sum(map(len, map(inputs.__getitem__, range(first, last + 1)))) > (
                    PACK_INPUT_BYTES
                ):
                    indices = indices[first - indices[0] :]  # the rest cut chunk by chunk
                    break
                spans.append((first, last))
            else:
                return spans
        first = last = -2
        n_bytes = 0
        for i in indices:
            n = len(inputs[i])
            if i == last + 1 and i - first < size and n_bytes + n <= PACK_INPUT_BYTES:
                last, n_bytes = i, n_bytes + n
                continue
            if first >= 0:
                spans.append((first, last))
            first = last = i
            n_bytes = n
        if first >= 0:
            spans.append((first, last))
        return spans
