"""fabric.map: a function over an iterable as a batch job, its results yielded as they come.

The iterable is read lazily through the run's windowed submission (coordinator/run/submit.py),
so a generator of millions of items never sits in memory: at most a window of chunks is in
flight or waiting for the caller to take its result. Each result is handed to the
iterating caller as it is folded; with `ordered=True` a result waits only for those before
it (at most a window's worth). Leaving the loop early
(`break`, an exception, a chunk's failure raised) stops the run, releases every lease, and
the map's job is removed like everything else of it: a map leaves nothing stored.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs

from vramfabric.broker.errors import ChunkFailed, ErrorKind, VramfabricError
from vramfabric.broker.messages import ChunkResult
from vramfabric.broker.settings import parse_size

from ..decoding import unpickle
from ..jobs.job import Job
from ..jobs.lifecycle import remove
from ..run.jobrun import JobRun

if TYPE_CHECKING:
    from ..run.runner import Runner

log = logging.getLogger(__name__)

# What the queue carries: (index, output bytes or the failed result); None ends it.
_Item = tuple[int, bytes | ChunkResult] | None


@attrs.define
class _Handover:
    """An aggregator that hands each chunk's output to the iterating caller."""

    queue: asyncio.Queue[_Item]

    def add(self, index: int, output: bytes) -> None:
        """Queue one output for the caller."""
        self.queue.put_nowait((index, output))

    def failed(self, result: ChunkResult) -> None:
        """Queue one failure for the caller (it is raised in the item's place)."""
        self.queue.put_nowait((result.index, result))

    def value(self) -> None:
        """Nothing: the results went to the caller one by one."""
        return None


async def map_results(
    runner: Runner,
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    vram: int | str | None = None,
    slices: int | None = None,
    ordered: bool = False,
    timeout_s: float | None = None,
) -> AsyncIterator[Any]:
    """Yield `fn(item)` for every item, as results arrive (or in order with `ordered`).

    Raises:
        ChunkFailed: an item's call failed (its error names the item's index and why).
        CodeRefused, CapacityExceeded, JobTimeout: as for Fabric.run.
    """
    queue: asyncio.Queue[_Item] = asyncio.Queue()
    handover = _Handover(queue)
    # A fresh id: two equal maps at once must not share (or resume) one job.
    job = Job(fn, items, job_id=uuid.uuid4().hex[:16])
    spec = await runner.prepare(job, handover)
    slice_bytes = parse_size(vram) if isinstance(vram, str) else vram
    pool = runner.lease_set(spec.job_id, job.work.runs_on, slice_bytes)
    run = runner.new_run(job, spec, handover, pool)
    run.results.on_failed = handover.failed
    # A chunk's place in the submission window is freed when the caller takes its result,
    # not when it arrives: a caller that stops reading stops the submission, and the queue
    # never holds more than a window of results.
    run.results.on_results = None
    drive: asyncio.Future[Any] | None = None
    try:
        done, _ = await run.start()
        drive = asyncio.ensure_future(runner.drive(run, done, set(), slices, 0, timeout_s))
        drive.add_done_callback(lambda _t: queue.put_nowait(None))
        async for value in _values(queue, ordered, run.window.finished):
            yield value
        await drive  # raises what ended the run (a timeout, the aggregator's error)
    finally:
        await _stop(runner, run, drive)


async def _values(
    queue: asyncio.Queue[_Item], ordered: bool, taken: Callable[[int], None]
) -> AsyncIterator[Any]:
    """The queued outcomes as values (a failure raised), in arrival or index order."""
    waiting: dict[int, bytes | ChunkResult] = {}
    next_index = 0
    while (item := await queue.get()) is not None:
        index, outcome = item
        if not ordered:
            taken(index)
            yield _value(index, outcome)
            continue
        waiting[index] = outcome
        while next_index in waiting:
            taken(next_index)
            yield _value(next_index, waiting.pop(next_index))
            next_index += 1


def _value(index: int, outcome: bytes | ChunkResult) -> Any:
    if isinstance(outcome, bytes):
        return unpickle(outcome)
    kind = outcome.error_kind or ErrorKind.ERROR
    raise ChunkFailed(kind, f"item {index}: {outcome.error}")


async def _stop(runner: Runner, run: JobRun, drive: asyncio.Future[Any] | None) -> None:
    """End the run if it still runs (its leases released), then remove the map's job.

    Without `drive` the run never started (JobRun.start cleaned up after itself).
    """
    if drive is not None and not drive.done():
        drive.cancel()
        await asyncio.gather(drive, return_exceptions=True)
    try:
        await asyncio.shield(remove(runner.conn, runner.broker, runner.tenant, run.spec.job_id))
    except VramfabricError as exc:  # recorded: what is left is swept with old jobs
        log.warning("map job not removed job=%s error=%s", run.spec.job_id, exc)
