"""PackRunner: a pack of tiny chunks on one lease's slot, in one executor frame.

The executor runs the pack's chunks one after another and sends back each one's outcome
(worker/executor/ipc.py, `pack_outcomes`); each chunk's failure is its own. A pack that runs
past one chunk's deadline, or whose executor ends under it, runs again chunk by chunk through
ChunkRunner, each under its own deadline, so only the chunk that hangs or crashes pays: it
is retried here, alone, on attempts of its own (the pack's message is not delivered again,
which would charge every chunk of it a delivery), and the others keep the pack's attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time

import attrs

from vramfabric.broker.errors import (
    ChunkFailed,
    ChunkTimeout,
    ErrorKind,
    ExecutorCrashed,
    TransientError,
)
from vramfabric.broker.messages import Chunk, ChunkResult, JobSpec, Lease
from vramfabric.broker.packs import ChunkPack, PackResult

from ..executor import ipc
from ..executor.captured import attach
from .runner import ChunkRunner
from .work import refusal

log = logging.getLogger(__name__)

# A pack's result stays this far under the server's 1 MiB payload: outputs that would take it
# past go to the outputs store, and its failures' texts (message, traceback, what they
# printed) share PACK_ERROR_CHARS (each keeps at least PACK_ERROR_CHARS_MIN).
PACK_RESULT_BYTES = 900 * 2**10
PACK_ERROR_CHARS = 256 * 2**10
PACK_ERROR_CHARS_MIN = 160


@attrs.define
class PackRunner:
    """Runs packs of chunks of any job on this node's executors, through its ChunkRunner."""

    runner: ChunkRunner

    async def run(self, spec: JobSpec, pack: ChunkPack, lease: Lease, attempt: int) -> PackResult:
        """Run a pack's chunks on the lease's slot, in one executor frame; each has its outcome.

        A pack that runs past one chunk's deadline, or whose executor ends under it, runs
        again here chunk by chunk, each under its own deadline: only a chunk that hangs or
        crashes pays for it.

        Raises:
            CodeRefused: this node may not run the job's work.
            TransientError: the job's work could not be had on this delivery (the pack is
                delivered again, whole); a chunk that hangs or crashes is retried alone.
        """
        r = self.runner
        code_ok = r.policy.allows_code(spec.tenant)
        contained = r.pool.containment.code_refusal
        refused = refusal(spec, r.settings.allow_code, r.simulated, code_ok, contained)
        if refused is not None:
            raise refused
        started_at = time.time()
        self.runner.ledger.occupy(lease.lease_id)
        try:
            outcomes, cost_s = await self._execute(spec, pack, lease, attempt)
        finally:
            self.runner.ledger.vacate(lease.lease_id)
        others, outputs = await self._sorted(spec, pack, outcomes, attempt)
        return PackResult(
            job=spec.job_id,
            first=pack.first,
            outputs=outputs,
            others=others,
            attempt=attempt,
            node=self.runner.node,
            lease_id=lease.lease_id,
            started_at=started_at,
            elapsed_s=time.time() - started_at,
            cost_s=cost_s,
        )

    async def _sorted(
        self, spec: JobSpec, pack: ChunkPack, outcomes: list[bytes | ChunkResult], attempt: int
    ) -> tuple[tuple[ChunkResult, ...], tuple[bytes | None, ...]]:
        """The pack's results of their own (`others`) and its inline outputs, in order."""
        if ipc.all_outputs(outcomes):  # type: ignore[arg-type]
            # All succeeded at the pack's attempt: inline if they all fit (as below, at once).
            sizes = list(map(len, outcomes))  # type: ignore[arg-type]
            small = max(sizes) <= self.runner.settings.inline_output_bytes
            if small and sum(sizes) + 16 * len(sizes) <= PACK_RESULT_BYTES:
                return (), tuple(outcomes)  # type: ignore[arg-type]
        # The failures first: what they take of the result's payload, the outputs may not.
        failed = [o for o in outcomes if isinstance(o, ChunkResult) and not o.ok]
        error_chars = max(PACK_ERROR_CHARS_MIN, PACK_ERROR_CHARS // max(1, len(failed)))
        others = {r.index: _shortened(r, error_chars) for r in failed}
        budget = PACK_RESULT_BYTES - sum(_text_bytes(r) + 256 for r in others.values())
        outputs: list[bytes | None] = []
        for offset, outcome in enumerate(outcomes):
            index = pack.first + offset
            if isinstance(outcome, ChunkResult) and not outcome.ok:
                outputs.append(None)
                continue
            # Succeeded: at the pack's attempt (its output), or retried alone (its own result).
            own = outcome if isinstance(outcome, ChunkResult) else None
            data = own.output or b"" if own is not None else outcome
            assert isinstance(data, bytes)
            inline, ref, budget = await self._place(spec, index, data, budget, own is not None)
            if own is None and inline is not None:
                outputs.append(inline)
                continue
            outputs.append(None)
            own = own or ChunkResult(job=spec.job_id, index=index, ok=True, attempt=attempt)
            others[index] = attrs.evolve(own, output=inline, output_ref=ref)
        return tuple(others.values()), tuple(outputs)

    async def _place(
        self, spec: JobSpec, index: int, data: bytes, budget: int, own: bool
    ) -> tuple[bytes | None, str | None, int]:
        """(inline output, or the outputs store's name for it; the result's room left).

        Inline while it is small and the pack's result has room (a result of its own takes
        more room there than a bare output); else in the outputs store, as a chunk's would be.
        """
        cost = len(data) + (256 if own else 16)
        if len(data) <= self.runner.settings.inline_output_bytes and cost <= budget:
            return data, None, budget - cost
        ref = await self.runner.store.put_output(spec.tenant, spec.job_id, index, data)
        return None, ref, budget - 256

    async def _execute(
        self, spec: JobSpec, pack: ChunkPack, lease: Lease, attempt: int
    ) -> tuple[list[bytes | ChunkResult], float]:
        """Each chunk's output, or its failed result; and what the pack cost."""
        work = await self.runner.loader.work_of(spec)
        frame = ipc.Run(
            args=dict(spec.args),
            inputs=tuple(pack.inputs),
            attempt=attempt,
            job=spec.job_id,
            index=pack.first,
        )
        timeout_s = spec.timeout_s or self.runner.settings.chunk_timeout_s
        try:
            packed, cost_s = await self.runner.pool.run(lease, work, frame, timeout_s)
            outcomes = ipc.unpack_outcomes(packed, len(pack.inputs))
        except (ChunkTimeout, ExecutorCrashed, ChunkFailed, ValueError) as exc:
            log.info("pack runs chunk by chunk job=%s first=%d: %s", pack.job, pack.first, exc)
            alone = [
                await self._alone(spec, Chunk(pack.job, pack.first + i, data), lease, attempt)
                for i, data in enumerate(pack.inputs)
            ]
            return alone, 0.0
        if ipc.all_outputs(outcomes):
            return outcomes, cost_s  # type: ignore[return-value]
        now = time.time()
        results: list[bytes | ChunkResult] = []
        for i, out in enumerate(outcomes):
            if isinstance(out, bytes):
                results.append(out)
            else:
                results.append(self._failed_outcome(spec, pack.first + i, out, attempt, lease, now))
        return results, cost_s

    async def _alone(
        self, spec: JobSpec, chunk: Chunk, lease: Lease, attempt: int
    ) -> bytes | ChunkResult:
        """One chunk of a pack run on its own: its output, or its own result.

        A chunk that hangs or crashes here is retried here, alone, on attempts of its own
        (`attempt + 1`, ... up to the job's max deliveries, after the retry policy's delay),
        as a chunk in a message of its own would be redelivered: its result names the attempt
        it succeeded (or finally failed) on. Its pack-mates keep the pack's attempt.
        """
        tries, delay_s = attempt, 0.0
        while True:
            # Each pass is a delivery of the chunk alone, after the delay the job's retry
            # policy gives it, as a nak(delay) would (none before the first).
            await asyncio.sleep(delay_s)
            started_at = time.time()
            try:
                output = (await self.runner.execute(spec, chunk, lease, tries))[0]
            except TransientError as exc:
                if tries >= spec.retry.max_deliver:
                    return self._failure(spec, chunk, exc, tries, lease, started_at)
                log.warning(
                    "packed chunk retried alone job=%s index=%d attempt=%d error=%s",
                    spec.job_id,
                    chunk.index,
                    tries,
                    exc,
                )
                delay_s, tries = spec.retry.nak_delay_s(tries), tries + 1
                continue
            except Exception as exc:  # recorded: the chunk's failed result names it
                return self._failure(spec, chunk, exc, tries, lease, started_at)
            if tries == attempt:
                return output
            return ChunkResult(
                job=spec.job_id,
                index=chunk.index,
                ok=True,
                output=output,
                attempt=tries,
                node=self.runner.node,
                lease_id=lease.lease_id,
                started_at=started_at,
                elapsed_s=time.time() - started_at,
            )

    def _failure(
        self,
        spec: JobSpec,
        chunk: Chunk,
        exc: BaseException,
        attempt: int,
        lease: Lease,
        started_at: float,
    ) -> ChunkResult:
        return self.runner.failed(
            spec.job_id, chunk.index, exc, attempt, lease.lease_id, started_at
        )

    def _failed_outcome(
        self,
        spec: JobSpec,
        index: int,
        outcome: ipc.Outcome,
        attempt: int,
        lease: Lease,
        started_at: float,
    ) -> ChunkResult:
        """The failed result of one chunk of a pack, from its outcome."""
        if not isinstance(outcome, tuple | list) or len(outcome) < 2:
            # Not what an executor of this version sends: the chunk failed, the reason unknown.
            outcome = (False, ErrorKind.ERROR.value, "the executor sent no outcome", "", "")
        try:
            kind = ErrorKind(str(outcome[1]))
        except ValueError:
            kind = ErrorKind.ERROR
        exc = ChunkFailed(kind, str(outcome[2]) if len(outcome) > 2 else "")
        if len(outcome) > 4:  # what it printed, its traceback (an older executor sends none)
            attach(exc, str(outcome[3]), str(outcome[4]))
        return self.runner.failed(spec.job_id, index, exc, attempt, lease.lease_id, started_at)


def _shortened(result: ChunkResult, max_chars: int) -> ChunkResult:
    """The result with its texts cut to `max_chars` together (each keeps its end).

    The error message first, then the traceback and what the chunk printed, half each of
    what is left (either takes what the other does not need).
    """
    error = _end(result.error or "", max_chars)
    left = max_chars - len(error)
    traceback = _end(result.traceback, max(left // 2, left - len(result.printed)))
    printed = _end(result.printed, left - len(traceback))
    if (error, traceback, printed) == (result.error or "", result.traceback, result.printed):
        return result
    return attrs.evolve(result, error=error, traceback=traceback, printed=printed)


def _end(text: str, max_chars: int) -> str:
    """`text`, or its last `max_chars` characters marked as cut."""
    if len(text) <= max_chars:
        return text
    return "..." + text[-(max_chars - 3) :] if max_chars > 3 else ""


def _text_bytes(result: ChunkResult) -> int:
    """What a result's texts take of a pack's result, encoded."""
    return sum(len(t.encode()) for t in (result.error or "", result.traceback, result.printed))
