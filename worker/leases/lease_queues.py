"""TenantQueues: each tenant's lease requests wait in a bounded queue of their own.

A node's lease service hears every tenant on one subscription, whose callback nats-py runs
one message at a time: served there, one tenant's flood (say renewals of 10,000 ids each, 600
in flight) would stand before everyone else's requests. The callback only sorts each request
into its tenant's queue, or refuses it at once when that queue is full; a task per tenant
serves its queue in order, yielding after each request, so tenants take turns on the event
loop: another tenant's request waits for about one request of the flooding tenant, not for
its whole queue.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

import attrs
from nats.aio.msg import Msg

from vramfabric.broker.stopping import stop_tasks


@attrs.define
class TenantQueues:
    """Per-tenant FIFO queues of requests, at most `limit` each, each served by its own task."""

    limit: int
    serve: Callable[[str, Msg], Awaitable[None]]
    _queues: dict[str, deque[Msg]] = attrs.field(factory=dict, init=False)
    _tasks: dict[str, asyncio.Task[None]] = attrs.field(factory=dict, init=False)

    def offer(self, tenant: str, msg: Msg) -> bool:
        """Queue the tenant's request; False (nothing queued) when its queue is full."""
        queue = self._queues.setdefault(tenant, deque())
        if len(queue) >= self.limit:
            return False
        queue.append(msg)
        if tenant not in self._tasks:
            task = asyncio.get_running_loop().create_task(self._drain(tenant, queue))
            self._tasks[tenant] = task
        return True

    def pending(self, tenant: str) -> int:
        """The tenant's requests queued or being served."""
        return len(self._queues.get(tenant, ()))

    async def _drain(self, tenant: str, queue: deque[Msg]) -> None:
        try:
            while queue:
                # The request stays queued (counted against the limit) while it is served.
                try:
                    await self.serve(tenant, queue[0])
                finally:
                    queue.popleft()
                await asyncio.sleep(0)  # the other tenants' requests run between this one's
        finally:
            # No await between the empty queue and here: a request offered meanwhile would
            # have found this task still registered and its queue still in place.
            del self._tasks[tenant]
            if not queue:
                self._queues.pop(tenant, None)

    async def close(self) -> None:
        """Stop serving: queued requests get no answer (their askers time out)."""
        # Until each has ended: a reply's publish may swallow a cancel (broker/stopping.py).
        await stop_tasks(self._tasks.values())
        self._queues.clear()
