"""LeaseDevices: per lease, one CUDA stream and one CuPy memory pool capped at its slice.

Made at a lease's first chunk in this executor process and kept for the lease's life, so
its chunks reuse the pool's cached blocks and the stream instead of building both per
chunk. The agent says when leases end (a `lease_ended` frame, sent when it reaps); a chunk
of the lease that is still running keeps them until it ends, then they are freed. The cap
holds for allocations through CuPy (arrays, a CudaKernel's buffers) made while the chunk
runs; not for the CUDA context, nor for other libraries' allocators.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import attrs


@attrs.define
class LeaseDevice:
    """One lease's stream and capped pool, and the chunks of it running now."""

    stream: Any
    pool: Any
    slice_bytes: int
    running: int = 0
    ended: bool = False


@attrs.define
class LeaseDevices:
    """The lease devices of one executor process, shared by its threads."""

    cupy: ModuleType
    _leases: dict[str, LeaseDevice] = attrs.field(factory=dict, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def __len__(self) -> int:
        return len(self._leases)

    @contextmanager
    def using(self, lease_id: str, slice_bytes: int) -> Iterator[LeaseDevice]:
        """The lease's device for one chunk (made on first use; call on the current device)."""
        with self._lock:
            device = self._leases.get(lease_id)
            if device is None:
                device = self._make(slice_bytes)
                self._leases[lease_id] = device
            device.running += 1
            device.ended = False  # a chunk after the agent's word: the lease is back
        try:
            yield device
        finally:
            with self._lock:
                device.running -= 1
                if device.ended and not device.running:
                    self._free(lease_id, device)

    def end(self, lease_id: str) -> None:
        """The lease ended: free its device now, or when its running chunk ends."""
        with self._lock:
            device = self._leases.get(lease_id)
            if device is None:
                return
            device.ended = True
            if not device.running:
                self._free(lease_id, device)

    def _make(self, slice_bytes: int) -> LeaseDevice:
        pool = self.cupy.cuda.MemoryPool()
        pool.set_limit(size=slice_bytes)
        return LeaseDevice(self.cupy.cuda.Stream(non_blocking=True), pool, slice_bytes)

    def _free(self, lease_id: str, device: LeaseDevice) -> None:
        del self._leases[lease_id]
        # Blocks still referenced (arrays a function kept) stay until they are dropped.
        device.pool.free_all_blocks()
