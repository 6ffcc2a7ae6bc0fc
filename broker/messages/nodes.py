"""What a node advertises: its GPUs, their free and leased VRAM, per-tenant leased bytes."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from .common import PROTOCOL_VERSION, ge0, gt0, is_token

# `GpuState.model` of a simulated GPU.
SIMULATED_MODEL = "simulated"


@attrs.frozen
class GpuState:
    """One GPU of a node as its advert shows it."""

    index: int = attrs.field(validator=ge0)
    model: str
    total_bytes: int = attrs.field(validator=ge0)
    free_bytes: int = attrs.field(validator=ge0)
    leased_bytes: int = attrs.field(validator=ge0)
    slice_bytes: int = attrs.field(validator=gt0)
    healthy: bool = True
    # Why the GPU is unhealthy (NVML's ECC, retired pages or rows, XID, heat); empty if healthy.
    problem: str = ""

    def free_slices(self, slice_bytes: int) -> int:
        """How many leases of `slice_bytes` this GPU could grant now."""
        if not self.healthy:
            return 0
        return self.free_bytes // round_up(slice_bytes, self.slice_bytes)


def round_up(n_bytes: int, granule_bytes: int) -> int:
    """`n_bytes` rounded up to whole granules (the VRAM a lease really takes)."""
    return -(-n_bytes // granule_bytes) * granule_bytes


@attrs.frozen
class NodeAdvert:
    """Heartbeat of a node: its GPUs and per-tenant leased bytes."""

    node: str = attrs.field(validator=is_token)
    gpus: tuple[GpuState, ...]
    tenants: Mapping[str, int]
    sent_at: float
    # `major.minor` of the worker's Python, and whether it runs Python callables.
    python: str = ""
    allow_code: bool = False
    # Leases held per job, keyed `<tenant>.<job>`: no longer sent (every tenant reads adverts,
    # and a job id is its tenant's alone; a tenant asks a node with HeldRequest). Kept so that
    # an older worker's advert still decodes.
    jobs: Mapping[str, int] = attrs.field(factory=dict)
    # Tenants this node lately could not give all they asked for (see docs/protocol.md).
    waiting: tuple[str, ...] = ()
    # How its executors are kept apart: "uid-per-tenant" or "shared-uid"
    # (worker/executors/containment.py).
    containment: str = ""
    v: int = PROTOCOL_VERSION
    # Whether it runs packed chunks (ChunkPack): a coordinator packs a job's chunks only while
    # every node holding its leases does, since a worker of an older version drops a pack.
    packs: bool = False
    # The most chunks it takes in one pack: an older node does not say, and takes 1,000.
    max_pack_chunks: int = attrs.field(default=1000, validator=attrs.validators.ge(1))
    # The registered kernels it runs, by name (built-ins and its --kernel-module ones): a
    # coordinator leases for a registered kernel only where it is listed. None: a worker of an
    # older version, which does not say (assumed to run any, as before).
    kernels: tuple[str, ...] | None = None
    # Recent service per tenant on this node (decayed byte-seconds, worker/leases/served.py): who
    # served least lately comes first when tenants outnumber slices.
    served: Mapping[str, float] = attrs.field(factory=dict)
    # Leases held per tenant on this node (counted like `tenants`).
    leases: Mapping[str, int] = attrs.field(factory=dict)

    @property
    def simulated(self) -> bool:
        """Whether the node's GPUs are simulated (NumPy on the CPU, no CUDA)."""
        return bool(self.gpus) and all(g.model == SIMULATED_MODEL for g in self.gpus)

    def free_slices(self, slice_bytes: int) -> int:
        """Leases of `slice_bytes` the node could grant now, over all healthy GPUs."""
        return sum(g.free_slices(slice_bytes) for g in self.gpus)
