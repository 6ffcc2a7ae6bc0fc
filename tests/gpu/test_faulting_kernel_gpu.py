"""A kernel that faults on the GPU fails its own chunks; leases beside it finish their job.

The fault (an illegal address) may poison the CUDA context of the executor process it ran
in: that process reports the chunk `crashed` and exits, the chunks of the healthy job that
shared it run again as bystanders, and the faulting chunk runs alone from then on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np

from tests.cuda_samples import FAULT, SAXPY
from tests.gpu.conftest import GpuAgent
from vramfabric.broker.errors import ErrorKind
from vramfabric.broker.retry import RetryPolicy
from vramfabric.coordinator import Fabric, Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.kernels import CudaKernel

N_FLOATS = 1024


def saxpy_reference(xp: object, data: bytes) -> bytes:
    """2.5 x + 1 over the chunk's float32s."""
    x = np.frombuffer(data, np.float32)
    return (x * np.float32(2.5) + np.float32(1.0)).astype(np.float32).tobytes()


def kernels() -> tuple[CudaKernel, CudaKernel]:
    healthy = CudaKernel(
        name="saxpy",
        entry="saxpy",
        grid=(4,),
        block=(256,),
        args=("in", "out", ("f32", 2.5), "in_bytes"),
        max_output_bytes=4 * N_FLOATS,
        max_input_bytes=4 * N_FLOATS,
        source=SAXPY,
        reference=saxpy_reference,
    )
    faulty = CudaKernel(
        name="fault",
        entry="fault",
        grid=(1,),
        block=(32,),
        args=("in", "out", "in_bytes"),
        max_output_bytes=4 * 32,
        source=FAULT,
    )
    return healthy, faulty


async def test_a_faulting_kernel_fails_alone_and_the_leases_beside_it_finish(
    gpu_agent: GpuAgent, gpu_fabric: Callable[..., Awaitable[Fabric]]
) -> None:
    # Given one GPU node and, at once, a healthy job and a faulting one of the same tenant
    await gpu_agent("g1", slice_bytes=256 * 2**20)
    fabric = await gpu_fabric(slice_bytes=256 * 2**20)
    healthy, faulty = kernels()
    rng = np.random.default_rng(16)
    inputs = [rng.standard_normal(N_FLOATS).astype(np.float32).tobytes() for _ in range(64)]
    good = Job(healthy, inputs)
    bad = Job(faulty, [b"\0" * 8 for _ in range(4)], retry=RetryPolicy(max_retries=1))
    # When both run
    good_result, bad_result = await asyncio.wait_for(
        asyncio.gather(fabric.run(good, Gather(), slices=8), fabric.run(bad, Gather(), slices=2)),
        timeout=240,
    )
    # Then every healthy chunk is right, and every faulting chunk failed as crashed
    assert good_result.n_ok == 64 and good_result.n_failed == 0
    for data, out in zip(inputs, good_result.value, strict=True):
        want = np.frombuffer(saxpy_reference(np, data), np.float32)
        np.testing.assert_allclose(out, want, rtol=1e-6)  # the GPU fuses a * x + 1
    assert bad_result.n_ok == 0 and bad_result.n_failed == 4
    assert {f.error_kind for f in bad_result.failures} == {ErrorKind.CRASHED}
    # And the node still runs chunks
    again = await fabric.run(Job(healthy, inputs[:4], job_id="after-the-fault"), Gather())
    assert again.n_ok == 4
