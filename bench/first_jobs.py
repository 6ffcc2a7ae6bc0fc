"""A fresh fleet's first jobs of a Python function whose chunks run long; one JSON line.

An embedded fabric of `--workers` simulated workers (`--allow-code`, 4x80GiB each: 640
leases) starts; then `--jobs` jobs of `--chunks` chunks run one after another, each chunk
sleeping `--sleep-s` (standing in for a chunk that waits on a device or I/O). A function's
leases each get a lane (an executor process) that must start first: the line shows, per job,
its seconds (the whole `Fabric.run`) and when its first and last chunk began (from the
chunks' own clocks), so how long a fresh fleet keeps users waiting, and how soon the
probe of auto packing lets every chunk go.

    python bench/first_jobs.py                      # 2 workers, 6 jobs of 128 x 0.3 s
    python bench/first_jobs.py --jobs 3 --chunks 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
import uuid

from vramfabric.coordinator import CoordinatorSettings, Fabric, Gather, Job
from vramfabric.local import LocalFleet


def sleeper(seconds: float) -> float:
    """Sleep `seconds`; return when the sleep began (epoch seconds)."""
    began = time.time()
    time.sleep(seconds)  # stands in for a chunk waiting on its device
    return began


async def run_jobs(workers: int, jobs: int, chunks: int, sleep_s: float) -> list[dict[str, float]]:
    """Start a fleet, run the jobs one after another; each job's figures."""
    fleet = LocalFleet(workers=workers, simulate="4x80GiB", worker_args=("--allow-code",))
    await asyncio.to_thread(fleet.start)
    out = []
    try:
        settings = CoordinatorSettings(slice_bytes=512 * 2**20, job_retention_s=0)
        async with await Fabric.connect(fleet.broker, settings) as fabric:
            for _ in range(jobs):
                job = Job(sleeper, [sleep_s] * chunks, job_id=uuid.uuid4().hex[:12])
                t0 = time.time()
                result = await fabric.run(job, Gather(), timeout_s=600)
                assert result.n_ok == chunks, result.failures
                began = sorted(float(b) - t0 for b in result.value)
                out.append(
                    {
                        "job_s": round(time.time() - t0, 3),
                        "first_chunk_s": round(began[0], 3),
                        "last_chunk_s": round(began[-1], 3),
                    }
                )
    finally:
        await asyncio.to_thread(fleet.stop)
    return out


def main() -> None:
    """Parse flags, run, print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--chunks", type=int, default=128)
    parser.add_argument("--sleep-s", type=float, default=0.3)
    args = parser.parse_args()
    figures = asyncio.run(run_jobs(args.workers, args.jobs, args.chunks, args.sleep_s))
    line = {
        "bench": "first_jobs",
        "workers": args.workers,
        "chunks": args.chunks,
        "sleep_s": args.sleep_s,
        "jobs": figures,
        "load_avg": [round(x, 2) for x in os.getloadavg()[:2]],
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
