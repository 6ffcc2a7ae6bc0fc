"""LeasePool: a lease set. Elastic acquisition, batched renewal and release.

A lease set outlives any one use of it: a batch run (JobRun) labels its set with the job's
id, so the nodes pull that job's chunks for its leases; an interactive block
(`fabric.gpu()`) holds one of its own for direct calls. Several runs and calls may use one.

Every request fits the server's max payload: an acquire asks one node for at most
`max_lease_batch` leases, and renewals and releases carry at most MAX_LEASE_IDS ids each, so
a node holding tens of thousands of a job's leases gets several requests per round.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import attrs

from vramfabric.broker.connection import Connection
from vramfabric.broker.messages import (
    MAX_LEASE_IDS,
    Lease,
    LeaseGrant,
    LeaseRequest,
    NodeAdvert,
    ReleaseReply,
    ReleaseRequest,
    RenewReply,
    RenewRequest,
)
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.stopping import stop_task

from ..metrics import CoordinatorMetrics
from ..settings import CoordinatorSettings
from .fleet import FleetView
from .node_calls import NodeLine, call_node, call_nodes
from .placement import plan

log = logging.getLogger(__name__)

# A pool that finds the fleet full asks one node anyway, at most this often: the denial
# tells the nodes this tenant is waiting, which is what makes them free its fair share.
_KNOCK_GAP_S = 0.5
# The shortest lifetime the renewal period is reckoned from (clocks of nodes and coordinator
# may disagree by a little: a lease is never renewed more often than every third of this).
_MIN_RENEW_TTL_S = 1.5


@attrs.define
class LeasePool:
    """The leases of one set (labelled `job` on the nodes), by id; grows, renews, releases."""

    conn: Connection
    broker: BrokerSettings
    settings: CoordinatorSettings
    fleet: FleetView
    job: str
    metrics: CoordinatorMetrics = attrs.field(factory=CoordinatorMetrics)
    # Which nodes may run the job (a Python function needs --allow-code and its Python).
    eligible: Callable[[NodeAdvert], bool] = attrs.field(default=lambda _advert: True)
    leases: dict[str, Lease] = attrs.field(factory=dict, init=False)
    denials: int = attrs.field(default=0, init=False)
    # What the last denial said of the queue: tenants standing before this one (None: unsaid).
    ahead: int | None = attrs.field(default=None, init=False)
    # Leases the nodes ended at renewal to give another tenant its fair share.
    revoked: int = attrs.field(default=0, init=False)
    peak: int = attrs.field(default=0, init=False)
    history: list[tuple[float, int]] = attrs.field(factory=list, init=False)
    # What this pool added to the shared gauge: pools of concurrent jobs move it by deltas.
    _counted: int = attrs.field(default=0, init=False)
    _renewer: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    _knocks: int = attrs.field(default=0, init=False)
    _knocked_at: float = attrs.field(default=0.0, init=False)
    # Loops check this as well as being cancelled: a cancellation racing a nats-py request
    # can be swallowed (asyncio.wait_for on Python 3.11), and the loop must still end.
    closing: bool = attrs.field(default=False, init=False)
    # Lease requests in flight. A caller cancelled mid-request (a run's timeout, a growth
    # stopped) leaves them running and `release` waits for them: cancelled with its caller, a
    # request a node had granted would leave those leases unknown to the pool, held until
    # their TTL.
    _asking: set[asyncio.Task[list[Lease]]] = attrs.field(factory=set, init=False)

    def __len__(self) -> int:
        return len(self.leases)

    async def acquire(self, wanted: int) -> int:
        """Ask the fleet for up to `wanted` more leases; return how many were granted.

        Requests go to all planned nodes in parallel, at most `max_lease_batch` leases each.
        A node that denies or grants fewer than it was asked in a request is left out of the
        next round; one that grants the whole batch is asked again. Rounds stop when the want
        is met, no advertised capacity is left or the pool is closing. Fewer than `wanted` is
        not an error: the job runs with what it got (CapacityExceeded is for callers that
        demand a minimum).
        """
        got = 0
        exclude: set[str] = set()
        eligible = sorted(
            (a for a in self.fleet.adverts.values() if self.eligible(a)), key=lambda a: a.node
        )
        while got < wanted and not self.closing:
            planned = plan(
                eligible,
                self.settings.slice_bytes,
                wanted - got,
                self.settings.placement,
                frozenset(exclude),
            )
            if not planned:
                if not exclude and eligible:
                    got += await self._knock(eligible, wanted)
                break
            # Cap here, not in _request, so the grant is compared with what was really asked.
            asks = [(node, min(n, self.settings.max_lease_batch)) for node, n in planned]
            grants = await asyncio.gather(*(self._request(node, n) for node, n in asks))
            for (node, asked), grant in zip(asks, grants, strict=True):
                got += len(grant)
                if len(grant) < asked:
                    exclude.add(node)
        if got:
            self._note()
        return got

    async def _knock(self, eligible: list[NodeAdvert], wanted: int) -> int:
        """Ask one node (in turn) though the fleet looks full, so the fleet learns we wait."""
        now = time.monotonic()
        if now - self._knocked_at < _KNOCK_GAP_S:
            return 0
        self._knocked_at = now
        node = eligible[self._knocks % len(eligible)].node
        self._knocks += 1
        return len(await self._request(node, min(wanted, self.settings.max_lease_batch)))

    async def _request(self, node: str, count: int) -> list[Lease]:
        if self.closing:  # `release` may already be past waiting for requests in flight
            return []
        task = asyncio.ensure_future(self._ask(node, count))
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)
        return await asyncio.shield(task)

    async def _ask(self, node: str, count: int) -> list[Lease]:
        req = LeaseRequest(
            request_id=uuid.uuid4().hex[:12],
            job=self.job,
            count=count,
            slice_bytes=self.settings.slice_bytes,
            ttl_s=self.settings.lease_ttl_s,
        )
        # A retry carries the same request_id: the node answers it with the same grant.
        round_trip = self.metrics.lease_acquire_seconds.labels(tenant=self.settings.tenant)
        with round_trip.time():
            grant = await self._call(node, "acquire", req, LeaseGrant)
        if not isinstance(grant, LeaseGrant):
            return []
        if grant.denied:
            self.denials += 1
            self.ahead = grant.ahead
            log.info("lease denied node=%s reason=%s", node, grant.denied)
        for lease in grant.leases:
            self.leases[lease.lease_id] = lease
        return list(grant.leases)

    def _note(self) -> None:
        held = self.metrics.leases_held.labels(tenant=self.settings.tenant)
        held.inc(len(self.leases) - self._counted)
        self._counted = len(self.leases)
        self.peak = max(self.peak, len(self.leases))
        self.history.append((time.time(), len(self.leases)))

    def prune(self, live_nodes: set[str]) -> int:
        """Forget leases on nodes whose advert vanished: their leases vanished with them."""
        gone = [i for i, lease in self.leases.items() if lease.node not in live_nodes]
        for lease_id in gone:
            del self.leases[lease_id]
        if gone:
            log.warning("leases lost with their node job=%s count=%d", self.job, len(gone))
            self._note()
        return len(gone)

    def nodes(self) -> set[str]:
        """The nodes the set holds leases on."""
        return {lease.node for lease in self.leases.values()}

    def by_node(self, leases: Iterable[Lease] | None = None) -> dict[str, list[str]]:
        """Lease ids (of the set, or of `leases`) grouped by node."""
        groups: dict[str, list[str]] = defaultdict(list)
        for lease in self.leases.values() if leases is None else leases:
            groups[lease.node].append(lease.lease_id)
        return groups

    def start_renewing(self) -> None:
        """Renew every lease each third of its TTL, in batches per node, until released."""
        self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())

    async def _renew_loop(self) -> None:
        while not self.closing:
            await asyncio.sleep(self.renew_period_s())  # the renewal period itself
            if not self.closing:
                await self.renew()

    def renew_period_s(self) -> float:
        """A third of the lease lifetime: the one asked for, or less where a node capped it.

        Nodes cut a TTL past their operator's cap (VRAMFABRIC_MAX_TTL_S), so a set that asked
        for a day renews by what it was given, before its leases expire.
        """
        ttl_s = self.settings.lease_ttl_s
        if self.leases:
            left_s = min(lease.expires_at for lease in self.leases.values()) - time.time()
            ttl_s = min(ttl_s, max(left_s, _MIN_RENEW_TTL_S))
        return ttl_s / 3

    def batches(self, leases: Iterable[Lease] | None = None) -> list[tuple[str, tuple[str, ...]]]:
        """(node, lease ids) pairs covering every lease, at most MAX_LEASE_IDS ids each."""
        return [
            (node, tuple(ids[i : i + MAX_LEASE_IDS]))
            for node, ids in self.by_node(leases).items()
            for i in range(0, len(ids), MAX_LEASE_IDS)
        ]

    async def renew(self) -> None:
        """Renew all leases once; leases a node no longer holds are dropped from the pool."""
        ttl_s = self.settings.lease_ttl_s
        requests = [(node, RenewRequest(ids, ttl_s)) for node, ids in self.batches()]
        replies = await self._call_all("renew", requests, RenewReply)
        for reply in replies:
            if isinstance(reply, RenewReply):
                for lease_id, expires_at in reply.expires_at.items():
                    if lease_id in self.leases:
                        self.leases[lease_id] = attrs.evolve(
                            self.leases[lease_id], expires_at=expires_at
                        )
                for lease_id in reply.unknown:
                    self.leases.pop(lease_id, None)
                for lease_id in reply.revoked:
                    self.leases.pop(lease_id, None)
                if reply.revoked:
                    self.revoked += len(reply.revoked)
                    log.info(
                        "leases revoked job=%s count=%d why=%s",
                        self.job,
                        len(reply.revoked),
                        reply.reason or "not said",
                    )
        self._note()

    async def release(self) -> int:
        """Release every lease now, in batches per node, in parallel; return the count."""
        self.closing = True
        if self._renewer is not None:
            error = await stop_task(self._renewer)  # a renewal's publish may swallow a cancel
            if error is not None:  # recorded: the leases go back all the same
                log.warning("lease renewal had stopped error=%r", error)
        # What requests still in flight grant goes back with the rest.
        await asyncio.gather(*self._asking, return_exceptions=True)
        return await self._release_ids(list(self.leases))

    async def _release_ids(self, lease_ids: list[str]) -> int:
        gone = [self.leases.pop(i) for i in lease_ids if i in self.leases]
        requests = [(node, ReleaseRequest(ids)) for node, ids in self.batches(gone)]
        replies = await self._call_all("release", requests, ReleaseReply)
        # Leases whose release failed expire on their own at their TTL.
        self._note()
        return sum(len(r.released) for r in replies if isinstance(r, ReleaseReply))

    async def _call_all(
        self, op: str, requests: Sequence[tuple[str, object]], reply_type: type
    ) -> list[object]:
        return await call_nodes(self._nodes(), op, requests, reply_type)

    async def _call(self, node: str, op: str, req: object, reply_type: type) -> object:
        return await call_node(self._nodes(), node, op, req, reply_type)

    def _nodes(self) -> NodeLine:
        return NodeLine(self.conn, self.broker, self.settings.tenant)
