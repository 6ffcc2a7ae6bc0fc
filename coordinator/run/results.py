"""ResultsConsumer: streams a job's results in, folds each chunk's first result exactly once.

An ordered consumer replays the results stream from the start, so a resumed job folds the
results of earlier runs too. A pack's result holds each of its chunks' outcomes; a chunk
that two results name (two packings of it in two runs) is folded once, from the first in
the stream, on every replay. Memory is one byte per chunk (seen.py) plus the aggregator's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence

import attrs
from nats.aio.msg import Msg
from prometheus_client import Counter

from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage
from vramfabric.broker.messages import ChunkResult, JobSpec
from vramfabric.broker.packs import PackResult
from vramfabric.broker.settings import BrokerSettings

from ..aggregate import Aggregator, add_run
from ..jobs.job import Span
from ..metrics import CoordinatorMetrics
from .follow import Follower
from .packing import ChunkSpeed
from .replay import StoredReplay
from .result_msgs import decode_result, failed_results, fetch_output
from .seen import SeenTable

log = logging.getLogger(__name__)

# Failed results kept for the report; the rest are only counted.
MAX_KEPT_FAILURES = 100

Progress = Callable[["ResultsConsumer"], None]


@attrs.define
class ResultsConsumer:
    """Folds one job's results into an aggregator as they arrive."""

    conn: Connection
    broker: BrokerSettings
    spec: JobSpec
    aggregator: Aggregator
    on_progress: Progress | None = None
    metrics: CoordinatorMetrics = attrs.field(factory=CoordinatorMetrics)
    # Chunks in the job: None while a streamed job's inputs are still being read (set_total).
    total: int | None = attrs.field(
        default=attrs.Factory(lambda self: self.spec.n_chunks, takes_self=True), kw_only=True
    )
    # Called with (first, n) as chunks first.. first + n - 1 are folded (frees window places).
    on_results: Callable[[int, int], None] | None = attrs.field(default=None, kw_only=True)
    # Called with each failed result as it is folded (`fabric.map` raises it in its place).
    on_failed: Callable[[ChunkResult], None] | None = attrs.field(default=None, kw_only=True)
    # No result for this long while the stream holds some for the job is a follower stall.
    stall_s: float = attrs.field(default=10.0, kw_only=True)
    # How long the job's chunks run, from their results (packing.py reads it).
    speed: ChunkSpeed = attrs.field(factory=ChunkSpeed, init=False)
    # `retry_failed`: stored failed results are set aside for a rerun until `replayed`.
    set_aside_failed: bool = attrs.field(default=False, kw_only=True)
    # The packs that hold a failure set aside: `retry_failed` reopens them whole.
    set_aside_packs: set[Span] = attrs.field(factory=set, init=False)
    n_ok: int = attrs.field(default=0, init=False)
    n_failed: int = attrs.field(default=0, init=False)
    duplicates: int = attrs.field(default=0, init=False)
    invalid: int = attrs.field(default=0, init=False)
    failures: list[ChunkResult] = attrs.field(factory=list, init=False)
    aggregate_s: float = attrs.field(default=0.0, init=False)
    _seen: SeenTable = attrs.field(init=False)
    _done: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _done_total: Counter = attrs.field(init=False)  # this tenant's series, looked up once
    _follower: Follower | None = attrs.field(default=None, init=False)
    # What the aggregator raised: the run stops and raises it (see `wait`).
    _error: Exception | None = attrs.field(default=None, init=False)
    _replay: StoredReplay = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        """Size the seen-table (a byte per chunk) to the job; it grows for a streamed job."""
        self._seen = SeenTable.sized(self.total or 0)
        self._replay = StoredReplay(self.set_aside_failed)
        self._done_total = self.metrics.chunks_done_total.labels(tenant=self.spec.tenant)

    @property
    def n_done(self) -> int:
        """Chunks with a final result (ok or failed)."""
        return self.n_ok + self.n_failed

    async def start(self) -> None:
        """Follow the job's results from the first one on."""
        s = self.broker.subjects
        self._follower = Follower(
            self.conn,
            s.result_filter(self.spec.tenant, self.spec.job_id),
            s.results_stream(self.spec.tenant),
            self._on_msg,
            self.broker.call_retry,
            stall_s=self.stall_s,
            on_fail=self._fail,
        )
        await self._follower.start()

    def _fail(self, exc: Exception) -> None:
        """Stop the run with `exc` (see `wait`): no more results will come."""
        self._error = exc
        self._done.set()
        self._replay.wake()

    def set_total(self, n_chunks: int) -> None:
        """The streamed job's chunk count, now that its inputs are read; done if all are in."""
        self.total = n_chunks
        if self.n_done >= n_chunks:
            self._done.set()

    async def _output(self, result: ChunkResult) -> ChunkResult:
        return await fetch_output(self.conn, self.broker, self.spec.tenant, result)

    def seen(self, index: int) -> bool:
        """Whether chunk `index` has a result folded in."""
        return self._seen.seen(index)

    async def _on_msg(self, msg: Msg) -> None:
        spec = self.spec
        # None also for chunks past the job's end (a job id reused with fewer inputs).
        span = self.broker.subjects.result_range(
            msg.subject, spec.tenant, spec.job_id, spec.n_chunks
        )
        try:
            span, got = decode_result(msg, span, spec)
        except InvalidMessage as exc:
            self.invalid += 1
            self.metrics.invalid("result")
            log.warning("bad result subject=%s error=%s", msg.subject, exc)
            if span is None:
                return  # dropped: it holds no chunk's place, so the job runs on
            # The stream keeps only the first result of a subject, so a bad one blocks the
            # real one: record its chunks as failed with the reason, rather than wait forever.
            for failed in failed_results(spec.job_id, span, exc):
                self.add(failed, span if span[1] > span[0] else None)
            return
        if isinstance(got, PackResult):
            await self._on_pack(got, span)
            return
        if got.ok:  # a chunk that failed at once says nothing of how long the others run
            self.speed.observe(got.cost_s or got.elapsed_s, 1, len(got.output or b""))
        self.add(await self._output(got))

    async def _on_pack(self, pack: PackResult, span: Span) -> None:
        """Fold each chunk of a pack's result."""
        if any(out is not None for out in pack.outputs):
            n_bytes = sum(map(len, filter(None, pack.outputs)))
            self.speed.observe(pack.cost_s or pack.elapsed_s, len(pack.outputs), n_bytes)
        # Counted (metrics, progress) once for the pack: per chunk, a tenth of a tiny job's CPU.
        fresh = not pack.others and not self._replay.waiting
        if fresh and self.fresh(pack.first, len(pack.outputs)):
            folded = self._fold_run(pack.first, pack.outputs)  # type: ignore[arg-type]
        else:
            folded = 0
            for index, output in enumerate(pack.outputs, pack.first):
                if output is not None and self._take(index, output, None):
                    folded += 1
        if folded:
            self._counted(pack.attempt, folded)
        for result in pack.others:
            self.add(await self._output(result), span)

    def add(self, result: ChunkResult, pack: Span | None = None) -> None:
        """Fold one result in (from the pack `pack`, if any), unless its chunk has one."""
        output = result.output if result.ok else None
        if self._take(result.index, output, result, pack):
            self._counted(result.attempt, 1)

    def _take(
        self,
        index: int,
        output: bytes | None,
        result: ChunkResult | None,
        pack: Span | None = None,
    ) -> bool:
        """Fold chunk `index`'s output, or its failure (`result`), unless it has one.

        True if it was folded and is to be counted (`_counted`).
        """
        if not self._first_of(index):
            return False
        if self._replay.reach(index, output is not None):
            if pack is not None:
                self.set_aside_packs.add(pack)
            return False
        self._seen.mark(index)
        if self.on_results is not None:
            self.on_results(index, 1)
        if output is not None:
            return self._aggregate(index, output)
        if result is not None:  # every failure comes with its result
            self._count_failure(result)
        return True

    def _counted(self, attempt: int, n_chunks: int) -> None:
        """`n_chunks` outcomes were folded after `attempt` deliveries each: count, show them."""
        self._done_total.inc(n_chunks)
        if attempt > 1:
            retries = (attempt - 1) * n_chunks
            self.metrics.chunks_retry_total.labels(tenant=self.spec.tenant).inc(retries)
        if self.on_progress is not None:
            self.on_progress(self)
        if self.n_done == self.total:
            self._done.set()

    def fresh(self, first: int, n: int) -> bool:
        """Whether none of chunks `first` .. `first + n - 1` has a result folded yet."""
        return self._seen.fresh(first, n)

    def _fold_run(self, first: int, outputs: Sequence[bytes]) -> int:
        """Fold the outputs of fresh chunks `first`, `first + 1`, ... at once; how many folded.

        A pack's chunks all new and all succeeded, the common case: marked, freed and folded
        in one go (per chunk, this bookkeeping cost more than decoding the output).
        """
        n = len(outputs)
        self._seen.mark(first, n)
        if self.on_results is not None:
            self.on_results(first, n)
        t0 = time.perf_counter()
        try:
            add_run(self.aggregator, first, outputs)
        except Exception as exc:  # the aggregator's (or the user's) bug: `wait` raises it
            self._fail(exc)
            return 0
        self.aggregate_s += time.perf_counter() - t0
        self.n_ok += n
        return n

    def _first_of(self, index: int) -> bool:
        """Whether chunk `index` has no result folded yet (a repeat is counted)."""
        if not self._seen.seen(index):
            return True
        # The stream keeps one result per subject; a replay after a consumer reset can repeat
        # it, and two runs may have packed a chunk differently.
        self.duplicates += 1
        self.metrics.chunks_duplicate_total.labels(tenant=self.spec.tenant).inc()
        return False

    def _aggregate(self, index: int, output: bytes) -> bool:
        """Fold an output into the aggregate; False if the aggregator raised (the run stops)."""
        t0 = time.perf_counter()
        try:
            self.aggregator.add(index, output)
        except Exception as exc:  # the aggregator's (or the user's) bug: `wait` raises it
            self._fail(exc)
            return False
        self.aggregate_s += time.perf_counter() - t0
        self.n_ok += 1
        return True

    def _count_failure(self, result: ChunkResult) -> None:
        if self.on_failed is not None:
            self.on_failed(result)
        self.n_failed += 1
        kind = result.error_kind.value if result.error_kind else "error"
        self.metrics.chunks_failed_total.labels(tenant=self.spec.tenant, kind=kind).inc()
        if len(self.failures) < MAX_KEPT_FAILURES:
            self.failures.append(result)

    async def replayed(self, stored: Collection[int]) -> set[int]:
        """Wait until every chunk of `stored` came through; return the failed ones set aside.

        From then on failures are folded like any result (those of the rerun are final).

        Raises:
            Exception: what the aggregator raised, or FollowerStalled.
        """
        aside = await self._replay.wait(stored, self.seen, lambda: self._error is not None)
        if self._error is not None:
            raise self._error
        return aside

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait until every chunk has a result; False on timeout.

        Raises:
            Exception: what the aggregator raised on a result (the job cannot be folded).
        """
        try:
            await asyncio.wait_for(self._done.wait(), timeout_s)
        except TimeoutError:
            return False
        if self._error is not None:
            raise self._error
        return True

    async def stop(self) -> None:
        """Stop following (the ordered consumer is ephemeral and goes with it)."""
        if self._follower is not None:
            await self._follower.stop()
