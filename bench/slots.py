"""Slots benchmark: the same chunks on 1 lease and on 8 (or 4) leases of one node.

A lease is an execution slot: 8 leases must run 8 chunks at once. Each chunk is a Python
function that sleeps `--chunk-s` (a stand-in for a kernel that keeps its slot busy), so the
speed-up measures the slots, not the CPU. One worker process (`--allow-code`, one simulated
GPU of 8 slices) on an embedded server; one JSON line, with the executor processes left
running at the end and their resident memory (the cost of the isolation level).

    python bench/slots.py                  # 32 chunks of 0.1 s, 3 runs each, medians
    python bench/slots.py --isolation process   # one executor process per lease
    python bench/slots.py --cpu --slots 4  # CPU-bound pure Python chunks on 1 and 4 leases

With `--cpu` each chunk is a pure-Python loop of about `--chunk-s` on one core: the speed-up
then measures whether a tenant's leases compute in parallel (each a process of its own) or
take turns on one GIL; it is bounded by the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time

from vramfabric.coordinator import CoordinatorSettings, Fabric, Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.local import LocalFleet


def nap(seconds: float) -> float:
    """Sleep (holding the slot), return the seconds slept."""
    time.sleep(seconds)  # stands in for a kernel that runs this long
    return seconds


def spin(loops: int) -> int:
    """Pure-Python CPU work holding the GIL: `loops` additions."""
    total = 0
    for i in range(loops):
        total += i
    return total


LOOPS_PER_S = 0  # calibrated in main(): loops of `spin` per second on one core


async def timed(fabric: Fabric, n: int, chunk_s: float, slices: int, run: int) -> float:
    """Seconds one job of `n` chunks takes on `slices` leases."""
    inputs: list[float] | list[int] = [chunk_s] * n
    if LOOPS_PER_S:
        inputs = [int(LOOPS_PER_S * chunk_s)] * n
    fn = spin if LOOPS_PER_S else nap
    job = Job(fn, inputs, job_id=f"slots{slices}r{run}t{time.time_ns()}")
    result = await fabric.run(job, Gather(), slices=slices, timeout_s=120)
    assert result.n_ok == n, result.failures
    await fabric.fleet.wait_changed(timeout_s=1.0)
    return float(result.phases_s["total_s"])


def executors_rss_bytes() -> tuple[int, int]:
    """(count, summed resident memory) of this machine's executor processes, from /proc."""
    count, rss = 0, 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"vramfabric.worker.executor" not in f.read():
                    continue
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            count += 1
        except OSError:
            continue  # the process ended meanwhile
    return count, rss


async def bench(
    fleet: LocalFleet, n: int, chunk_s: float, runs: int, isolation: str, slots: int
) -> dict[str, object]:
    """Median job time on 1 and on `slots` slots, and the executors it took."""
    settings = CoordinatorSettings(slice_bytes=2**30)
    async with await Fabric.connect(fleet.broker, settings) as fabric:
        # Warm-ups: executors (a lane per lease of a function) started and code cached before
        # each series, so the series time the slots, not process starts (about 0.6 s each).
        await timed(fabric, slots, 0.01, slots, -1)
        one = [await timed(fabric, n, chunk_s, 1, r) for r in range(runs)]
        await timed(fabric, slots, 0.01, slots, -2)
        many = [await timed(fabric, n, chunk_s, slots, r) for r in range(runs)]
        procs, rss = executors_rss_bytes()
    return {
        "bench": "slots_cpu" if LOOPS_PER_S else "slots",
        "isolation": isolation,
        "slots": slots,
        "executor_processes": procs,
        "executors_rss_mib": round(rss / 2**20, 1),
        "chunks": n,
        "chunk_s": chunk_s,
        "runs": runs,
        "one_slot_s_median": round(statistics.median(one), 4),
        "many_slots_s_median": round(statistics.median(many), 4),
        "speedup": round(statistics.median(one) / statistics.median(many), 2),
        "ideal_many_slots_s": round(n * chunk_s / slots, 4),
        "machine": f"{platform.machine()} {os.cpu_count()} cores "
        f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> int:
    """Parse flags, start the fleet, print one JSON line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--chunk-s", type=float, default=0.1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--isolation", choices=("thread", "process"), default="thread")
    parser.add_argument("--slots", type=int, default=8, help="leases of the parallel run")
    parser.add_argument("--cpu", action="store_true", help="CPU-bound chunks, not sleeps")
    args = parser.parse_args()
    if args.cpu:
        global LOOPS_PER_S
        t0 = time.perf_counter()
        spin(2_000_000)
        LOOPS_PER_S = int(2_000_000 / (time.perf_counter() - t0))
    fleet = LocalFleet(
        workers=1,
        simulate="1x8GiB",
        slice_size="1GiB",
        worker_args=("--allow-code", "--isolation", args.isolation),
    )
    with fleet:
        line = asyncio.run(
            bench(fleet, args.chunks, args.chunk_s, args.runs, args.isolation, args.slots)
        )
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
