"""`vramfabric status` counts slices in each GPU's own slice size."""

from __future__ import annotations

from vramfabric.broker.messages import GpuState, NodeAdvert
from vramfabric.report import status_dict

MIB = 2**20


def gpu(index: int, free_bytes: int, slice_bytes: int) -> GpuState:
    """A GPU of 8 GiB with `free_bytes` free in slices of `slice_bytes`."""
    return GpuState(index, "sim", 8 * 2**30, free_bytes, 8 * 2**30 - free_bytes, slice_bytes)


def test_status_counts_free_slices_in_each_gpus_own_slice_size() -> None:
    # Given two nodes whose GPUs advertise 256 MiB and 1 GiB slices
    a = NodeAdvert("a", (gpu(0, 1024 * MIB, 256 * MIB),), tenants={}, sent_at=0.0)
    b = NodeAdvert("b", (gpu(0, 2048 * MIB, 1024 * MIB),), tenants={}, sent_at=0.0)
    # When status summarises them
    status = status_dict([a, b])
    # Then free slices are 4 of 256 MiB plus 2 of 1 GiB, whatever a client's slice setting
    assert status["slices_free"] == 4 + 2
    assert status["slice_bytes"] == [256 * MIB, 1024 * MIB]
