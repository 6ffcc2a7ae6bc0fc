"""GpuMemory: the VRAM of a node's GPUs as its leases hold it, NVML's free figure, health.

Part of the ledger (ledger.py), which alone changes it: bytes are taken at a grant and
given back when a lease ends (or, if its slot still runs a chunk, when the slot is idle).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import attrs

from vramfabric.broker.messages import GpuState

from ..node.gpus import GpuSpec
from ..node.health import GpuReading


@attrs.define
class GpuMemory:
    """Leased bytes, NVML's free memory and problems, per GPU of one node."""

    gpus: tuple[GpuSpec, ...]
    _used: dict[int, int] = attrs.field(factory=dict, init=False)
    # GPU index -> why it is unhealthy (absent: healthy).
    _problems: dict[int, str] = attrs.field(factory=dict, init=False)
    # GPU index -> (NVML's free memory at the last reading, bytes leased there then); absent
    # when not measured (a simulated GPU). NVML cannot see a lease whose chunk has not yet
    # allocated, so what was leased since the reading comes off its figure.
    _device_free: dict[int, tuple[int, int]] = attrs.field(factory=dict, init=False)
    _total_bytes: dict[int, int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._total_bytes = {g.index: g.total_bytes for g in self.gpus}

    def take(self, gpu: int, n_bytes: int) -> None:
        """A lease took `n_bytes` on `gpu`."""
        self._used[gpu] = self._used.get(gpu, 0) + n_bytes

    def give_back(self, gpu: int, n_bytes: int) -> None:
        """A lease's `n_bytes` on `gpu` are free again."""
        self._used[gpu] -= n_bytes

    def spread(self, need: int, count: int) -> list[int]:
        """The GPU of each of up to `count` new slices of `need` bytes: most free first."""
        # Ties go to the lower index, so a fresh node's grants are deterministic.
        heap = [(-self.free_bytes(g.index), g.index) for g in self.gpus]
        heap = [(free, i) for free, i in heap if i not in self._problems and -free >= need]
        heapq.heapify(heap)
        out: list[int] = []
        while heap and len(out) < count:
            free, index = heap[0]
            out.append(index)
            if -free - need >= need:
                heapq.heapreplace(heap, (free + need, index))
            else:
                heapq.heappop(heap)
        return out

    def free_bytes(self, gpu: int) -> int:
        """VRAM a new lease could take on a GPU: the ledger's, capped at NVML's free."""
        used = self._used.get(gpu, 0)
        free = self._total_bytes[gpu] - used
        if gpu not in self._device_free:
            return free
        device_free, used_then = self._device_free[gpu]
        return max(0, min(free, device_free - max(0, used - used_then)))

    def observe(self, readings: Iterable[GpuReading]) -> list[int]:
        """Take in NVML's readings: the GPUs that turned unhealthy with them, in their order."""
        failed: list[int] = []
        for r in readings:
            if r.free_bytes is None:
                self._device_free.pop(r.index, None)
            else:
                self._device_free[r.index] = (r.free_bytes, self._used.get(r.index, 0))
            if not r.problem:
                self._problems.pop(r.index, None)
                continue
            if r.index not in self._problems:
                failed.append(r.index)
            self._problems[r.index] = r.problem
        return failed

    def problem(self, gpu: int) -> str:
        """Why the GPU is unhealthy; empty when it is healthy (it then takes leases)."""
        return self._problems.get(gpu, "")

    @property
    def leased_bytes(self) -> int:
        """VRAM held by leases over all GPUs."""
        return sum(self._used.values())

    def states(self, granule_bytes: int) -> tuple[GpuState, ...]:
        """Each GPU's state for the node's advert."""
        return tuple(
            GpuState(
                index=g.index,
                model=g.model,
                total_bytes=g.total_bytes,
                free_bytes=self.free_bytes(g.index),
                leased_bytes=self._used.get(g.index, 0),
                slice_bytes=granule_bytes,
                healthy=g.index not in self._problems,
                problem=self.problem(g.index),
            )
            for g in self.gpus
        )
