"""LeaseIntake: a node's lease requests as they arrive, sorted by tenant or refused at once.

The lease service's one subscription hears every tenant; nats-py runs its callback one
message at a time, so the callback does no serving: a request with no inbox to answer is
dropped (counted), one too large is refused unread, and the rest wait in their tenant's
bounded queue (worker/leases/lease_queues.py), one past the bound refused at once as `busy`. The
queues are served by turns, and each answer is sent back here, with its event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import attrs
import nats.errors
from nats.aio.msg import Msg

from vramfabric.broker.codec import encode
from vramfabric.broker.errors import ErrorKind
from vramfabric.broker.messages import (
    MAX_LEASE_IDS,
    ErrorReply,
    Event,
    HeldReply,
    LeaseGrant,
    ReleaseReply,
    RenewReply,
)
from vramfabric.broker.subjects import Subjects

from ..node.metrics import WorkerMetrics
from .lease_queues import TenantQueues

log = logging.getLogger(__name__)

Reply = LeaseGrant | RenewReply | ReleaseReply | HeldReply | ErrorReply
# Serves one request: (subject, payload) -> (reply, tenant, outcome).
Answer = Callable[[str, bytes], Awaitable[tuple[Reply, str, str]]]
# Core NATS publish, for events.
Publish = Callable[[str, bytes], Awaitable[None]]
# A tenant's lease requests queued or in service on one node, unless told otherwise.
QUEUE_LIMIT = 64
# A lease request payload over this is refused unread: a batch of MAX_LEASE_IDS ids of
# 100 characters each fits (the coordinator's are 14 to 17).
MAX_REQUEST_BYTES = 32 * 1024


@attrs.define
class LeaseIntake:
    """Takes a node's lease requests off its subscription into per-tenant queues."""

    subjects: Subjects
    node: str
    metrics: WorkerMetrics
    answer: Answer
    publish: Publish
    queue_limit: int = QUEUE_LIMIT
    _queues: TenantQueues = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._queues = TenantQueues(self.queue_limit, self._serve)

    async def handle(self, msg: Msg) -> None:
        """Queue one request under its tenant, or refuse it at once (the subscription callback)."""
        if not msg.reply or not self.subjects.is_inbox(msg.reply):
            # No one to answer; and answering a non-inbox would publish, with this agent's
            # rights, where the asker chose.
            self.metrics.invalid("lease.reply")
            log.debug("lease request refused: reply %r is not an inbox", msg.reply)
            return
        try:
            tenant, _node, op = self.subjects.parse_lease(msg.subject)
        except ValueError as exc:
            await self._serve("", msg)  # answered as invalid, at once
            log.debug("unparsed lease subject=%s error=%s", msg.subject, exc)
            return
        if len(msg.data) > MAX_REQUEST_BYTES:
            self.metrics.invalid(f"lease.{op}")
            why = (
                f"invalid lease request: payload of {len(msg.data)} bytes exceeds "
                f"{MAX_REQUEST_BYTES} (at most {MAX_LEASE_IDS} lease ids a request)"
            )
            await self._respond(msg, ErrorReply(kind=ErrorKind.INVALID_MESSAGE, error=why))
            return
        if not self._queues.offer(tenant, msg):
            self.metrics.lease_requests_total.labels(tenant=tenant, op=op, outcome="busy").inc()
            why = (
                f"busy: node {self.node} is serving {self.queue_limit} lease requests of "
                f"tenant {tenant} already; retry when some are answered"
            )
            await self._respond(msg, ErrorReply(kind=ErrorKind.BUSY, error=why))

    async def close(self) -> None:
        """Stop serving: queued requests are dropped (their askers time out)."""
        await self._queues.close()

    async def _serve(self, _tenant: str, msg: Msg) -> None:
        reply, tenant, outcome = await self.answer(msg.subject, msg.data)
        await self._respond(msg, reply)
        event = _event_of(reply, self.node, tenant if outcome == "ok" else "")
        if event is not None:
            await self.send(self.subjects.event(event.kind), encode(event))

    async def _respond(self, msg: Msg, reply: Reply) -> None:
        try:
            await msg.respond(encode(reply))
        except nats.errors.Error as exc:  # the asker times out; nothing changes here
            log.warning("lease reply not sent subject=%s error=%s", msg.subject, exc)

    async def send(self, subject: str, data: bytes) -> None:
        """Publish an event for observers (lost, and logged, if the connection fails)."""
        try:
            await self.publish(subject, data)
        except nats.errors.Error as exc:  # an event for observers only: lost, logged
            log.debug("lease event not sent subject=%s error=%s", subject, exc)


def _event_of(reply: object, node: str, tenant: str) -> Event | None:
    """The `granted`/`released` event for observers, if the reply changed the ledger."""
    now = time.time()
    if isinstance(reply, LeaseGrant) and reply.leases:
        job = reply.leases[0].job
        return Event("granted", node=node, tenant=tenant, job=job, count=len(reply.leases), at=now)
    if isinstance(reply, ReleaseReply) and reply.released:
        return Event("released", node=node, tenant=tenant, count=len(reply.released), at=now)
    return None
