"""ChunkRunner: run one chunk on its lease's slot and turn the outcome into a ChunkResult.

The slot is held (its VRAM kept out of the pool) from the moment the chunk starts until it
ends, whatever ends it. The work runs in an executor process under the chunk's deadline; a
checkpoint of an earlier delivery is handed back in; a large output goes to the object store.

Only the chunk that hung or crashed its executor pays for it (a failed attempt). A chunk
whose executor was killed for a neighbour's deadline runs again here, on a fresh executor;
one whose executor crashed with other chunks in it runs again alone, and pays only if it
crashes alone. Either way the message stays with this worker (the keepalive holds its ack
wait) and no JetStream delivery is spent: a nak or redelivery would count one.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import OrderedDict

import attrs

from vramfabric.broker.errors import (
    ChunkFailed,
    ChunkTimeout,
    ErrorKind,
    ExecutorCrashed,
    VramfabricError,
)
from vramfabric.broker.messages import Chunk, ChunkResult, JobSpec, Lease
from vramfabric.broker.tenants import TenantPolicy

from ..executor import ipc
from ..executor.captured import carried
from ..executors.outcomes import Bystander, Suspect
from ..executors.pool import ExecutorPool
from ..leases.ledger import SliceLedger
from ..node.settings import WorkerSettings
from .store import ChunkStore
from .work import WorkLoader, refusal

log = logging.getLogger(__name__)

_MAX_ERROR_CHARS = 2000
# Chunks that hung or crashed an executor, remembered per node (a chunk id each): their
# next delivery runs alone.
MAX_SUSPECTS = 10_000
# Times one delivery of a chunk is run again for others' sake before it gives up as crashed.
MAX_RERUNS = 4


@attrs.define
class ChunkRunner:
    """Executes chunks of any job on this node's executors."""

    settings: WorkerSettings
    ledger: SliceLedger
    pool: ExecutorPool
    loader: WorkLoader
    store: ChunkStore
    simulated: bool
    # Who may run code, by tenant (everyone when no tenants file is in force).
    policy: TenantPolicy = attrs.field(factory=TenantPolicy)
    # Chunks that checkpointed or resumed here: their checkpoint goes when their result is in.
    _checkpointed: set[tuple[str, str, int]] = attrs.field(factory=set, init=False)
    # Chunks that were in an executor when it crashed or timed out (oldest first).
    _suspects: OrderedDict[tuple[str, str, int], None] = attrs.field(
        factory=OrderedDict, init=False
    )

    @property
    def node(self) -> str:
        """This node's name."""
        return self.settings.node

    async def run(self, spec: JobSpec, chunk: Chunk, lease: Lease, attempt: int) -> ChunkResult:
        """Run the chunk on the lease's slot; return its ok result.

        Raises:
            VramfabricError: CodeRefused, ChunkTimeout, ExecutorCrashed, ChunkFailed, ...
        """
        code_ok, contained = self.policy.allows_code(spec.tenant), self.pool.containment
        refused = refusal(
            spec, self.settings.allow_code, self.simulated, code_ok, contained.code_refusal
        )
        if refused is not None:
            raise refused
        started_at = time.time()
        self.ledger.occupy(lease.lease_id)
        try:
            output, cost_s = await self.execute(spec, chunk, lease, attempt)
        finally:
            self.ledger.vacate(lease.lease_id)
        ref = None
        if len(output) > self.settings.inline_output_bytes:
            ref = await self.store.put_output(spec.tenant, spec.job_id, chunk.index, output)
        return ChunkResult(
            job=spec.job_id,
            index=chunk.index,
            ok=True,
            output=None if ref else output,
            output_ref=ref,
            attempt=attempt,
            node=self.node,
            lease_id=lease.lease_id,
            started_at=started_at,
            elapsed_s=time.time() - started_at,
            cost_s=cost_s,
        )

    async def execute(
        self, spec: JobSpec, chunk: Chunk, lease: Lease, attempt: int
    ) -> tuple[bytes, float]:
        """The chunk's output and what it cost (see `ExecutorPool.run`)."""
        key = (spec.tenant, spec.job_id, chunk.index)
        work = await self.loader.work_of(spec)
        frame = ipc.Run(
            args=dict(spec.args),
            input=chunk.input,
            attempt=attempt,
            job=spec.job_id,
            index=chunk.index,
            resumed=await self._resumed(spec, key) if attempt > 1 else None,
        )

        async def save(state: bytes) -> None:
            await self.store.save_checkpoint(*key, state)
            self._checkpointed.add(key)

        timeout_s = spec.timeout_s or self.settings.chunk_timeout_s
        # A chunk that crashed or hung an executor here runs alone from then on.
        alone = key in self._suspects
        for _rerun in range(MAX_RERUNS + 1):
            try:
                return await self.pool.run(lease, work, frame, timeout_s, save, alone)
            except Bystander as exc:
                log.info("chunk runs again job=%s index=%d: %s", key[1], key[2], exc)
            except Suspect as exc:
                log.info("chunk runs again alone job=%s index=%d: %s", key[1], key[2], exc)
                alone = True
            except (ChunkTimeout, ExecutorCrashed):
                self._suspects[key] = None
                while len(self._suspects) > MAX_SUSPECTS:
                    self._suspects.popitem(last=False)
                raise
            if key in self._checkpointed:  # it may have checkpointed before it was stopped
                frame = attrs.evolve(frame, resumed=await self._resumed(spec, key))
        raise ExecutorCrashed(f"executor ended under this chunk {MAX_RERUNS + 1} times")

    async def _resumed(self, spec: JobSpec, key: tuple[str, str, int]) -> bytes | None:
        """The last checkpoint of a chunk delivered again (only functions checkpoint)."""
        if spec.kernel_kind != "python":
            return None
        state = await self.store.load_checkpoint(*key)
        if state is not None:
            self._checkpointed.add(key)
        return state

    async def forget_checkpoint(self, tenant: str, job: str, index: int) -> None:
        """Delete the chunk's checkpoint once its result is stored (best effort)."""
        key = (tenant, job, index)
        if key not in self._checkpointed:
            return
        self._checkpointed.discard(key)
        try:
            await self.store.delete_checkpoint(*key)
        except VramfabricError as exc:
            log.warning("checkpoint not deleted job=%s index=%d error=%s", job, index, exc)

    def failed(
        self,
        job: str,
        index: int,
        exc: BaseException,
        attempt: int,
        lease_id: str,
        started_at: float,
    ) -> ChunkResult:
        """A failed result naming the error's kind; an unexpected one is logged with a traceback.

        What the chunk printed, and its traceback, come with the error
        (worker/executor/captured.py).
        """
        if isinstance(exc, ChunkFailed):
            kind, message = exc.error_kind, str(exc)
        elif isinstance(exc, VramfabricError):
            kind, message = exc.kind, str(exc)
        else:
            # Unexpected exceptions are permanent: logged once here, where they become a result.
            log.error("chunk failed job=%s index=%d", job, index, exc_info=exc)
            kind = ErrorKind.ERROR
            message = "".join(traceback.format_exception_only(exc)).strip()
        printed, trace = carried(exc)
        return ChunkResult(
            job=job,
            index=index,
            ok=False,
            error_kind=kind,
            error=message[:_MAX_ERROR_CHARS],
            attempt=attempt,
            node=self.node,
            lease_id=lease_id,
            started_at=started_at,
            elapsed_s=time.time() - started_at,
            printed=printed,
            traceback=trace,
        )
