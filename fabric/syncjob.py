"""SyncJob: `fabric.job(ID)` of `vramfabric.connect()`, a stored job by id from any thread.

The sync form of coordinator/api/jobhandle.py's JobHandle: each call runs on the fabric's own
loop (sync.py) and blocks the caller; `*_async` forms await it from the caller's loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from vramfabric.coordinator.aggregate import Aggregator
from vramfabric.coordinator.api.jobhandle import JobHandle, JobStatus
from vramfabric.coordinator.run.jobresult import JobResult

if TYPE_CHECKING:
    from .loop_thread import LoopThread


@attrs.define
class SyncJob:
    """A stored job: `status()`, `cancel()`, and `result()` (re-attached or resumed)."""

    _loop: LoopThread
    handle: JobHandle

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self.handle.job_id

    def status(self) -> JobStatus:
        """Where the job stands (see JobHandle.status)."""
        return self._loop.call(self.handle.status())

    def cancel(self) -> bool:
        """Stop the job; False if it had already finished (see JobHandle.cancel)."""
        return self._loop.call(self.handle.cancel())

    def result(
        self, aggregator: Aggregator | None = None, *, timeout_s: float | None = None
    ) -> JobResult:
        """The job's aggregate: followed, read back or resumed (see JobHandle.result)."""
        return self._loop.call(self.handle.result(aggregator, timeout_s=timeout_s))

    async def result_async(
        self, aggregator: Aggregator | None = None, *, timeout_s: float | None = None
    ) -> JobResult:
        """The async form of `result`."""
        return await self._loop.call_async(self.handle.result(aggregator, timeout_s=timeout_s))
