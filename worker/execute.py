"""Run one chunk on a backend and turn any outcome into a ChunkResult."""

from __future__ import annotations

import logging
import time
import traceback

import attrs

from vramfabric.broker.errors import ErrorKind, VramfabricError
from vramfabric.broker.messages import Chunk, ChunkResult, JobSpec, Lease
from vramfabric.kernels import Registry

from .backends import Backend, lookup

log = logging.getLogger(__name__)

_MAX_ERROR_CHARS = 2000


@attrs.define
class ChunkRunner:
    """Executes chunks of any job on this node's backend, with the node's kernel registry."""

    registry: Registry
    backend: Backend
    node: str

    async def run(self, spec: JobSpec, chunk: Chunk, lease: Lease) -> bytes:
        """Run the job's kernel on the chunk within the lease's slice.

        Raises:
            VramfabricError: KernelNotFound, KernelLaunchFailed, SliceVramExceeded, ...
        """
        kernel = lookup(self.registry, spec.kernel, spec.kernel_digest)
        return await self.backend.run(kernel, spec.args, chunk.input, lease.gpu, lease.slice_bytes)

    def ok(
        self, job: str, index: int, output: bytes, attempt: int, lease_id: str, started_at: float
    ) -> ChunkResult:
        """A successful result."""
        return ChunkResult(
            job=job,
            index=index,
            ok=True,
            output=output,
            attempt=attempt,
            node=self.node,
            lease_id=lease_id,
            started_at=started_at,
            elapsed_s=time.time() - started_at,
        )

    def failed(
        self,
        job: str,
        index: int,
        exc: BaseException,
        attempt: int,
        lease_id: str,
        started_at: float,
    ) -> ChunkResult:
        """A failed result naming the error's kind; unexpected errors carry a traceback tail."""
        if isinstance(exc, VramfabricError):
            kind, message = exc.kind, str(exc)
        else:
            # Unexpected exceptions are permanent: logged once here, where they become a result.
            log.error("chunk failed job=%s index=%d", job, index, exc_info=exc)
            kind = ErrorKind.ERROR
            message = "".join(traceback.format_exception_only(exc)).strip()
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
        )
