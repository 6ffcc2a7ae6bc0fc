"""PackRunner: a pack of tiny chunks on one lease's slot, in one executor frame.

The executor runs the pack's chunks one after another and sends back each one's outcome
(worker/ipc.py, `pack_outcomes`); each chunk's failure is its own. A pack that runs past one
chunk's deadline, or whose executor ends under it, runs again chunk by chunk through
ChunkRunner, each under its own deadline, so only the chunk that hangs or crashes pays.
"""

from __future__ import annotations

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

from . import ipc
from .slot import ChunkRunner
from .work import refusal

log = logging.getLogger(__name__)

# A pack's result stays this far under the server's 1 MiB payload: outputs that would take it
# past go to the outputs store, and its failures' messages share PACK_ERROR_CHARS (each keeps
# at least PACK_ERROR_CHARS_MIN).
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
            TransientError: a chunk could not run on this delivery and has deliveries left
                (the pack is delivered again, whole).
        """
        r = self.runner
        code_ok = r.policy.allows_code(spec.tenant)
        refused = refusal(spec, r.settings.allow_code, r.simulated, code_ok)
        if refused is not None:
            raise refused
        started_at = time.time()
        self.runner.ledger.occupy(lease.lease_id)
        try:
            outcomes, cost_s = await self._execute(spec, pack, lease, attempt)
        finally:
            self.runner.ledger.vacate(lease.lease_id)
        # The failures first: what they take of the result's payload, the outputs may not.
        failed = [o for o in outcomes if isinstance(o, ChunkResult)]
        error_chars = max(PACK_ERROR_CHARS_MIN, PACK_ERROR_CHARS // max(1, len(failed)))
        others = {r.index: _shortened(r, error_chars) for r in failed}
        budget = PACK_RESULT_BYTES - sum(len(r.error or "") + 256 for r in others.values())
        outputs: list[bytes | None] = []
        for offset, outcome in enumerate(outcomes):
            index = pack.first + offset
            if isinstance(outcome, ChunkResult):
                outputs.append(None)
                continue
            small = len(outcome) <= self.runner.settings.inline_output_bytes
            if small and len(outcome) + 16 <= budget:
                budget -= len(outcome) + 16
                outputs.append(outcome)
                continue
            # Too large to travel here: the outputs store, as a single chunk's would.
            ref = await self.runner.store.put_output(spec.tenant, spec.job_id, index, outcome)
            outputs.append(None)
            budget -= 256
            others[index] = ChunkResult(
                job=spec.job_id, index=index, ok=True, output_ref=ref, attempt=attempt
            )
        return PackResult(
            job=spec.job_id,
            first=pack.first,
            outputs=tuple(outputs),
            others=tuple(others.values()),
            attempt=attempt,
            node=self.runner.node,
            lease_id=lease.lease_id,
            started_at=started_at,
            elapsed_s=time.time() - started_at,
            cost_s=cost_s,
        )

    async def _execute(
        self, spec: JobSpec, pack: ChunkPack, lease: Lease, attempt: int
    ) -> tuple[list[bytes | ChunkResult], float]:
        """Each chunk's output, or its failed result; and what the pack cost."""
        work = await self.runner.loader.work_of(spec)
        frame = {
            "args": dict(spec.args),
            "inputs": list(pack.inputs),
            "attempt": attempt,
            "job": spec.job_id,
            "index": pack.first,
            "resumed": None,
        }
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
        now = time.time()
        results: list[bytes | ChunkResult] = []
        for i, out in enumerate(outcomes):
            output = out[1]
            if out[0] and isinstance(output, bytes):
                results.append(output)
            else:
                results.append(self._failed_outcome(spec, pack.first + i, out, attempt, lease, now))
        return results, cost_s

    async def _alone(
        self, spec: JobSpec, chunk: Chunk, lease: Lease, attempt: int
    ) -> bytes | ChunkResult:
        """One chunk of a pack run on its own: its output, or its failed result."""
        started_at = time.time()
        try:
            return (await self.runner.execute(spec, chunk, lease, attempt))[0]
        except TransientError as exc:
            if attempt < spec.retry.max_deliver:
                raise
            failure: BaseException = exc
        except Exception as exc:  # recorded: the chunk's failed result names it
            failure = exc
        return self.runner.failed(
            spec.job_id, chunk.index, failure, attempt, lease.lease_id, started_at
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
        try:
            kind = ErrorKind(str(outcome[1]))
        except ValueError:
            kind = ErrorKind.ERROR
        exc = ChunkFailed(kind, str(outcome[2]) if len(outcome) > 2 else "")
        return self.runner.failed(spec.job_id, index, exc, attempt, lease.lease_id, started_at)


def _shortened(result: ChunkResult, max_chars: int) -> ChunkResult:
    """The result with its error message cut to `max_chars` (its end, where the cause is)."""
    error = result.error or ""
    if len(error) <= max_chars:
        return result
    return attrs.evolve(result, error="..." + error[-(max_chars - 3) :])
