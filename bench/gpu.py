"""GPU benchmark: what the fabric adds around CUDA kernels on one GPU.

It needs an NVIDIA GPU and `pip install '.[gpu]'`; without CUDA it says why on stderr,
prints one JSON line `{"bench": "gpu", "skipped": "..."}` and exits 0.

- `overhead`: per chunk, an executor's GPU path (worker/executor/work_runner.py: the lease's
  stream and capped pool, the input copied in, the zeroed `out`, the launch, the wait, `out` copied
  back) with the module cached, against the kernel's own time (CUDA events around the bare
  launch): `overhead_us` is the difference.
- `first_result_s`: from `Fabric.run` to the first result of a job on a node that has just
  started (a lease, the executor's start, the module's compile included); `acquire_s`.
- `leases`: `--chunks` chunks of a busy kernel (about `--kernel-ms` each) on 1, 2, 4 and 8
  leases of one GPU (one executor process, a stream per lease), chunks/s, against one
  process launching the same chunks one after another (`direct_chunks_per_s`).

    python bench/gpu.py
    python bench/gpu.py --chunks 400 --kernel-ms 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import struct
import sys
import time
from types import ModuleType
from typing import Any

SPIN = r"""
extern "C" __global__ void spin(const unsigned long long* in, float* out, unsigned long long n) {
    unsigned long long loops = n >= 8 ? in[0] : 0;
    float x = (float)threadIdx.x;
    for (unsigned long long i = 0; i < loops; ++i) x = x * 0.9999f + 0.0001f;
    out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}
"""
GRID, BLOCK = 4, 128
SLICE_BYTES = 256 * 2**20


def cuda_missing() -> str:
    """Why there is no CUDA here, or ""."""
    try:
        import cupy
    except ImportError:
        return "cupy is not installed (pip install 'vramfabric[gpu]' on a GPU machine)"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return f"no CUDA device: {exc}"
    return "" if count else "no CUDA device: the driver reports 0 GPUs"


def spin_kernel() -> Any:
    """The busy kernel: `loops` (the chunk's 8 bytes) multiply-adds per thread."""
    from vramfabric.kernels import CudaKernel

    return CudaKernel(
        name="spin",
        entry="spin",
        grid=(GRID,),
        block=(BLOCK,),
        args=("in", "out", "in_bytes"),
        max_output_bytes=4 * GRID * BLOCK,
        max_input_bytes=8,
        source=SPIN,
    )


def kernel_ms(cupy: ModuleType, kernel: Any, loops: int, repeats: int = 20) -> float:
    """The bare kernel's time on the GPU (CUDA events), median of `repeats`, in ms."""
    from vramfabric.kernels import ModuleCache

    function = ModuleCache().function(kernel)
    stream = cupy.cuda.Stream(non_blocking=True)
    data = cupy.asarray([loops], dtype=cupy.uint64)
    out = cupy.zeros(GRID * BLOCK, dtype=cupy.float32)
    times = []
    with stream:
        for _ in range(repeats):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            function((GRID,), (BLOCK,), (data, out, cupy.uint64(8)))
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(statistics.median(times))


def loops_for(cupy: ModuleType, kernel: Any, target_ms: float) -> int:
    """The loop count that makes one chunk take about `target_ms` on this GPU."""
    loops = 1000
    while kernel_ms(cupy, kernel, loops) < target_ms / 2 and loops < 2**40:
        loops *= 4
    return max(1, int(loops * target_ms / max(kernel_ms(cupy, kernel, loops), 1e-3)))


def overhead(cupy: ModuleType, kernel: Any, loops: int, chunks: int) -> dict[str, float]:
    """Per chunk: the executor's GPU path with a cached module, against the bare kernel."""
    from vramfabric.kernels import builtin_registry
    from vramfabric.kernels.code import Context
    from vramfabric.worker.executor import ipc
    from vramfabric.worker.executor.work_runner import WorkRunner

    runner = WorkRunner(builtin_registry, simulated=False)
    runner.add_blob(kernel.digest, kernel.to_blob())
    frame = ipc.Run(
        kind="cuda",
        digest=kernel.digest,
        input=struct.pack("<Q", loops),
        slice_bytes=SLICE_BYTES,
        lease="bench",
        job="bench",
        index=0,
        attempt=1,
    )
    ctx = Context(device=0, slice_bytes=SLICE_BYTES, xp=cupy, attempt=1, job="bench", index=0)
    runner.execute(frame, ctx)  # the module's compile, the lease's stream and pool
    t0 = time.perf_counter()
    for _ in range(chunks):
        runner.execute(frame, ctx)
    chunk_us = (time.perf_counter() - t0) / chunks * 1e6
    bare_us = kernel_ms(cupy, kernel, loops) * 1e3
    return {
        "chunk_us": round(chunk_us, 1),
        "kernel_us": round(bare_us, 1),
        "overhead_us": round(chunk_us - bare_us, 1),
    }


async def through_fabric(kernel: Any, loops: int, chunks: int) -> dict[str, Any]:
    """A fresh node on this GPU: lease to first result, then 1/2/4/8 leases."""
    from vramfabric.broker import connect
    from vramfabric.coordinator import CoordinatorSettings, Fabric, Job
    from vramfabric.coordinator.aggregate import Gather
    from vramfabric.local import LocalFleet
    from vramfabric.worker import Agent, WorkerSettings

    fleet = LocalFleet(workers=0).start()
    agent = None
    try:
        broker = fleet.broker
        settings = WorkerSettings(node="gpu0", slice_bytes=SLICE_BYTES)
        agent = Agent(broker, settings, await connect(broker, name="gpu0"))
        await agent.start()
        coordinator = CoordinatorSettings(slice_bytes=SLICE_BYTES, max_slices=8)
        async with await Fabric.connect(broker, coordinator) as fabric:
            deadline = time.monotonic() + 10.0
            while "gpu0" not in fabric.fleet.adverts and time.monotonic() < deadline:
                await fabric.fleet.wait_changed(timeout_s=0.5)
            data = struct.pack("<Q", loops)
            first: list[float] = []
            t0 = time.perf_counter()

            def progress(_results: object) -> None:
                if not first:
                    first.append(time.perf_counter() - t0)

            result = await fabric.run(Job(kernel, [data]), Gather(), slices=1, progress=progress)
            line: dict[str, Any] = {
                "first_result_s": round(first[0], 3) if first else None,
                "acquire_s": round(result.phases_s.get("acquire_s", 0.0), 3),
            }
            rates = {}
            for slices in (1, 2, 4, 8):
                job = Job(kernel, [data] * chunks, job_id=f"bench-gpu-{slices}-{time.time_ns()}")
                t0 = time.perf_counter()
                await fabric.run(job, Gather(), slices=slices)
                rates[str(slices)] = round(chunks / (time.perf_counter() - t0), 1)
            line["leases_chunks_per_s"] = rates
            return line
    finally:
        if agent is not None:
            await agent.stop(grace_s=1.0)
            await agent.conn.close()
        fleet.stop()


def direct_rate(cupy: ModuleType, kernel: Any, loops: int, chunks: int) -> float:
    """Chunks/s of one process launching the chunks one after another (no fabric)."""
    from vramfabric.kernels import ModuleCache

    modules = ModuleCache()
    data = struct.pack("<Q", loops)
    with cupy.cuda.Stream(non_blocking=True):
        kernel.launch(cupy, data, modules)
        t0 = time.perf_counter()
        for _ in range(chunks):
            kernel.launch(cupy, data, modules)
    return round(chunks / (time.perf_counter() - t0), 1)


def main() -> int:
    """Parse flags, measure, print one JSON line (or the reason there is no CUDA)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--kernel-ms", type=float, default=1.0)
    args = parser.parse_args()
    missing = cuda_missing()
    if missing:
        print(f"bench/gpu.py needs a GPU: {missing}", file=sys.stderr)
        print(json.dumps({"bench": "gpu", "skipped": missing}), flush=True)
        return 0
    import cupy

    kernel = spin_kernel()
    loops = loops_for(cupy, kernel, args.kernel_ms)
    line: dict[str, Any] = {"bench": "gpu", "loops": loops, "chunks": args.chunks}
    line["overhead"] = overhead(cupy, kernel, loops, args.chunks)
    line["direct_chunks_per_s"] = direct_rate(cupy, kernel, loops, args.chunks)
    line |= asyncio.run(through_fabric(kernel, loops, args.chunks))
    props = cupy.cuda.runtime.getDeviceProperties(0)
    line["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    line["machine"] = f"{platform.machine()}, {os.cpu_count()} cpus"
    line["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
