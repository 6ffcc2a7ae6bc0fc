"""SliceLedger: the node's only truth about its VRAM. Pure: no I/O, time is passed in.

Expiry runs on the node's monotonic clock (`now`); the unix `expires_at` in a lease is for
its holder to read. A lease that is released or expires while its slot runs a chunk stops
being renewable and usable at once, but its VRAM returns to the pool only when the slot is
idle again (`vacate`): until then no other lease can be granted on that memory.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

import attrs

from vramfabric.broker.messages import (
    Lease,
    LeaseGrant,
    LeaseRequest,
    NodeAdvert,
    ReleaseReply,
    RenewReply,
    round_up,
)

from ..node.gpus import GpuSpec
from ..node.health import GpuReading
from .gpu_memory import GpuMemory


@attrs.define
class SliceLedger:
    """Grants, renews, releases and reaps leases of VRAM slices on one node's GPUs.

    A lease takes `slice_bytes` rounded up to the node's slice granule. Grants are atomic
    (one call, no await inside), so two concurrent requests can never oversubscribe a GPU.
    """

    node: str
    gpus: tuple[GpuSpec, ...]
    granule_bytes: int
    max_ttl_s: float = 3600.0
    # The GPUs' VRAM: what leases hold of it, NVML's free figure, their health.
    memory: GpuMemory = attrs.field(init=False)
    _leases: dict[str, Lease] = attrs.field(factory=dict, init=False)
    # request_id -> (tenant, lease ids), so a retried request gets the same grant.
    _requests: dict[str, tuple[str, tuple[str, ...]]] = attrs.field(factory=dict, init=False)
    # request_id -> how many of its leases are still held (O(1) forgetting on release).
    _held_of_request: dict[str, int] = attrs.field(factory=dict, init=False)
    # (tenant, job) -> lease ids: pullers ask per job on every chunk, so this stays O(1).
    _by_job: dict[tuple[str, str], set[str]] = attrs.field(factory=dict, init=False)
    # Monotonic expiry and grant time per lease id.
    _deadline: dict[str, float] = attrs.field(factory=dict, init=False)
    _granted: dict[str, float] = attrs.field(factory=dict, init=False)
    # Monotonic time each lease's slot last went idle: its grant, or the end of its last run.
    _idle_since: dict[str, float] = attrs.field(factory=dict, init=False)
    # Leases whose slot runs a chunk now, and those of them already released or expired.
    _busy: set[str] = attrs.field(factory=set, init=False)
    _retiring: dict[str, Lease] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self.memory = GpuMemory(self.gpus)

    def grant(
        self, req: LeaseRequest, tenant: str, now: float, wall: float | None = None
    ) -> LeaseGrant:
        """Grant up to `req.count` slices, each on the healthy GPU with the most free memory.

        Spreading keeps the node's leases (and their chunks' memory bandwidth) over all its
        GPUs. `now` is the monotonic clock; `wall` (default `now`) the unix time for
        `expires_at`.
        """
        owner, ids = self._requests.get(req.request_id, (tenant, ()))
        if owner != tenant:
            # Never hand one tenant's leases (or their ids) to another.
            return LeaseGrant(node=self.node, leases=(), denied="request_id in use; pick another")
        if ids:
            held = tuple(self._leases[i] for i in ids if i in self._leases)
            return LeaseGrant(node=self.node, leases=held)
        need = round_up(req.slice_bytes, self.granule_bytes)
        ttl_s = min(req.ttl_s, self.max_ttl_s)
        expires_at = (now if wall is None else wall) + ttl_s
        granted: list[Lease] = []
        for gpu in self.memory.spread(need, req.count):
            lease = Lease(
                lease_id=f"{req.request_id}-{len(granted)}",
                node=self.node,
                gpu=gpu,
                slice_bytes=need,
                job=req.job,
                tenant=tenant,
                expires_at=expires_at,
            )
            self._leases[lease.lease_id] = lease
            self._deadline[lease.lease_id] = now + ttl_s
            self._granted[lease.lease_id] = now
            self._idle_since[lease.lease_id] = now
            self._by_job.setdefault((tenant, req.job), set()).add(lease.lease_id)
            self.memory.take(gpu, need)
            granted.append(lease)
        if not granted:
            return LeaseGrant(
                node=self.node, leases=(), denied=f"no free slice of {need} bytes on {self.node}"
            )
        self._requests[req.request_id] = (tenant, tuple(lease.lease_id for lease in granted))
        self._held_of_request[req.request_id] = len(granted)
        return LeaseGrant(node=self.node, leases=tuple(granted))

    def free_bytes(self, gpu: int) -> int:
        """VRAM a new lease could take on a GPU: the ledger's, capped at NVML's free."""
        return self.memory.free_bytes(gpu)

    def renew(
        self,
        lease_ids: Iterable[str],
        tenant: str,
        ttl_s: float,
        now: float,
        wall: float | None = None,
    ) -> RenewReply:
        """Extend the tenant's live leases to `now + ttl_s`; others are reported unknown."""
        ttl_s = min(ttl_s, self.max_ttl_s)
        expires_at = (now if wall is None else wall) + ttl_s
        renewed: dict[str, float] = {}
        unknown: list[str] = []
        for lease_id in lease_ids:
            lease = self._leases.get(lease_id)
            if lease is None or lease.tenant != tenant or not self.is_live(lease_id, now):
                unknown.append(lease_id)
                continue
            self._leases[lease_id] = attrs.evolve(lease, expires_at=expires_at)
            self._deadline[lease_id] = now + ttl_s
            renewed[lease_id] = expires_at
        return RenewReply(expires_at=renewed, unknown=tuple(unknown))

    def release(self, lease_ids: Iterable[str], tenant: str) -> ReleaseReply:
        """Return the tenant's leases to the pool now; others are reported unknown."""
        released: list[str] = []
        unknown: list[str] = []
        for lease_id in lease_ids:
            lease = self._leases.get(lease_id)
            if lease is None or lease.tenant != tenant:
                unknown.append(lease_id)
                continue
            self._drop(lease)
            released.append(lease_id)
        return ReleaseReply(released=tuple(released), unknown=tuple(unknown))

    def reap(self, now: float) -> list[Lease]:
        """Remove every lease past its expiry and return them."""
        expired = [
            lease for lease in self._leases.values() if self._deadline[lease.lease_id] <= now
        ]
        for lease in expired:
            self._drop(lease)
        return expired

    def _drop(self, lease: Lease) -> None:
        del self._leases[lease.lease_id]
        del self._deadline[lease.lease_id]
        del self._granted[lease.lease_id]
        del self._idle_since[lease.lease_id]
        ids_of_job = self._by_job[(lease.tenant, lease.job)]
        ids_of_job.discard(lease.lease_id)
        if not ids_of_job:
            del self._by_job[(lease.tenant, lease.job)]
        if lease.lease_id in self._busy:
            # Its slot still runs a chunk: the VRAM comes back when the slot is idle.
            self._retiring[lease.lease_id] = lease
        else:
            self.memory.give_back(lease.gpu, lease.slice_bytes)
        # Forget the request once all its leases are gone, so the map cannot grow forever.
        request_id = lease.lease_id.rsplit("-", 1)[0]
        held = self._held_of_request.get(request_id, 1) - 1
        if held > 0:
            self._held_of_request[request_id] = held
        else:
            self._held_of_request.pop(request_id, None)
            self._requests.pop(request_id, None)

    def is_live(self, lease_id: str, now: float) -> bool:
        """Whether the lease is held and not past its (monotonic) expiry."""
        deadline = self._deadline.get(lease_id)
        return deadline is not None and now < deadline

    def held_for(self, lease_id: str, now: float) -> float:
        """How long (monotonic seconds) the lease has been held; 0 if it is not."""
        granted = self._granted.get(lease_id)
        return 0.0 if granted is None else now - granted

    def idle_for(self, lease_id: str, now: float) -> float:
        """How long (monotonic seconds) the lease's slot has run nothing; 0 while it runs."""
        since = self._idle_since.get(lease_id)
        return 0.0 if since is None or lease_id in self._busy else now - since

    def is_busy(self, lease_id: str) -> bool:
        """Whether the lease's slot runs a chunk now."""
        return lease_id in self._busy

    def knows(self, request_id: str) -> bool:
        """Whether a request with that id was granted and still holds leases here."""
        return request_id in self._requests

    def occupy(self, lease_id: str) -> None:
        """Mark the lease's slot as running a chunk."""
        self._busy.add(lease_id)

    def vacate(self, lease_id: str) -> None:
        """Mark the slot idle; a lease released or expired meanwhile gives its VRAM back now."""
        self._busy.discard(lease_id)
        if lease_id in self._idle_since:
            self._idle_since[lease_id] = time.monotonic()
        lease = self._retiring.pop(lease_id, None)
        if lease is not None:
            self.memory.give_back(lease.gpu, lease.slice_bytes)

    def holding(self) -> list[Lease]:
        """Every lease that holds VRAM: the live ones and those whose slot still runs."""
        return [*self._leases.values(), *self._retiring.values()]

    def leases_of(self, tenant: str, job: str) -> list[Lease]:
        """The leases held for one job of one tenant."""
        return [self._leases[i] for i in self._by_job.get((tenant, job), ())]

    def get(self, lease_id: str) -> Lease | None:
        """The lease with that id, if held."""
        return self._leases.get(lease_id)

    def observe(self, readings: Iterable[GpuReading]) -> list[Lease]:
        """Take in NVML's readings; drain GPUs that turned unhealthy and return their leases.

        A drained lease ends at once like an expired one (renewals call it unknown, and no
        new chunk starts on it); a chunk running on it finishes and then frees its VRAM.
        """
        drained: list[Lease] = []
        for index in self.memory.observe(readings):
            drained += [lease for lease in self._leases.values() if lease.gpu == index]
        for lease in drained:
            self._drop(lease)
        return drained

    def problem(self, gpu: int) -> str:
        """Why the GPU is unhealthy; empty when it is healthy (it then takes leases)."""
        return self.memory.problem(gpu)

    @property
    def leased_bytes(self) -> int:
        """VRAM held by leases over all GPUs."""
        return self.memory.leased_bytes

    def __len__(self) -> int:
        return len(self._leases)

    def advert(self, now: float) -> NodeAdvert:
        """The node's advert: per-GPU free and leased bytes, per-tenant usage; no job ids."""
        tenants: Counter[str] = Counter()
        leases: Counter[str] = Counter()
        for lease in self.holding():
            tenants[lease.tenant] += lease.slice_bytes
            leases[lease.tenant] += 1
        gpus = self.memory.states(self.granule_bytes)
        return NodeAdvert(
            node=self.node, gpus=gpus, tenants=dict(tenants), sent_at=now, leases=dict(leases)
        )
