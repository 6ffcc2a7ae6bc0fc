"""A GPU node's advert says what NVML says: each GPU's name, total and (at most) free memory."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.gpu.conftest import GpuAgent
from tests.helpers import eventually
from vramfabric.coordinator import Fabric
from vramfabric.worker.node.gpus import open_nvml, text

SLICE_BYTES = 2**30


async def test_the_advert_shows_nvmls_gpus_and_no_more_free_memory_than_nvml(
    gpu_agent: GpuAgent, gpu_fabric: Callable[..., Awaitable[Fabric]]
) -> None:
    # Given a node on this machine's GPUs, and NVML read directly
    await gpu_agent("g1", slice_bytes=SLICE_BYTES)
    fabric = await gpu_fabric(slice_bytes=SLICE_BYTES)
    await eventually(lambda: "g1" in fabric.fleet.adverts)
    nvml = open_nvml()
    assert nvml is not None
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        names = [text(nvml.nvmlDeviceGetName(h)) for h in handles]
        memory = [nvml.nvmlDeviceGetMemoryInfo(h) for h in handles]
    finally:
        nvml.nvmlShutdown()
    gpus = fabric.fleet.adverts["g1"].gpus
    # Then the advert has NVML's GPUs, names and totals
    assert [g.model for g in gpus] == names
    assert [g.total_bytes for g in gpus] == [int(m.total) for m in memory]
    # And never more free memory than NVML saw free (give or take one slice of drift)
    for gpu, mem in zip(gpus, memory, strict=True):
        assert gpu.free_bytes <= int(mem.free) + SLICE_BYTES
        assert gpu.healthy or gpu.problem  # an unhealthy GPU says why
