"""Packed tiny chunks: 100,000 chunks end to end (leases to aggregate), one JSON line a run.

An embedded fabric of two simulated workers (`--allow-code`) runs a job of `--n` tiny
chunks: each evaluates one hyperparameter configuration's loss, a few microseconds of Python,
so what is measured is the fabric's cost per chunk. A job is the whole `Fabric.run`: spec,
leases, submit, execute, fold, release. The aggregate is the argmin, checked against the one
computed here, and an index table checks that every chunk's result was folded exactly once;
`leases_peak` is the most leases a job held. `--chunks-per-message` sets packing (0: auto,
the default; 1: off).

    python bench/packed.py                   # 100,000 chunks, 3 jobs, auto packing
    python bench/packed.py --chunks-per-message 1 --n 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
import uuid
from datetime import date
from typing import Any

from vramfabric.coordinator import ArgMin, CoordinatorSettings, Fabric, Job
from vramfabric.local import LocalFleet


def loss(config: int) -> float:
    """The loss of configuration `config` of the search space (a tiny chunk of work)."""
    lr, depth = (config % 997) / 997.0, config % 13
    return (lr - 0.4242) ** 2 + 0.01 * (depth - 7) ** 2


class CheckedArgMin(ArgMin):
    """ArgMin that also counts how often each chunk is folded."""

    def __init__(self, n: int) -> None:
        """Count folds of `n` chunks."""
        super().__init__()
        self.folds = bytearray(n)

    def add(self, index: int, output: bytes) -> None:
        """Fold one output; count it."""
        self.folds[index] = min(255, self.folds[index] + 1)
        super().add(index, output)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the fleet, run the jobs, return the figures."""
    fleet = LocalFleet(workers=2, simulate="1x80GiB", worker_args=("--allow-code",))
    await asyncio.to_thread(fleet.start)
    settings = CoordinatorSettings(
        slice_bytes=512 * 2**20, job_retention_s=0, chunks_per_message=args.chunks_per_message
    )
    fabric = await Fabric.connect(fleet.broker, settings)
    configs = list(range(args.n))
    expected = min(configs, key=lambda c: (loss(c), c))
    times: list[float] = []
    phases: list[dict[str, float]] = []
    peaks: list[int] = []
    try:
        await fabric.run(Job(loss, configs[:1000]), ArgMin())  # warm: executors, code loaded
        for k in range(args.jobs):
            agg = CheckedArgMin(args.n)
            job = Job(loss, configs, job_id=f"packed{k}-{uuid.uuid4().hex[:8]}")
            t0 = time.perf_counter()
            result = await fabric.run(job, agg)
            times.append(time.perf_counter() - t0)
            phases.append(result.phases_s)
            peaks.append(result.leases_peak)
            assert result.n_ok == args.n, f"{result.n_failed} chunks failed"
            assert result.value is not None and result.value[0] == expected, result.value
            assert agg.folds == bytearray([1]) * args.n, "a chunk was folded twice or never"
    finally:
        await fabric.close()
        await asyncio.to_thread(fleet.stop)
    median = statistics.median(times)
    return {
        "bench": "packed",
        "n": args.n,
        "chunks_per_message": args.chunks_per_message or "auto",
        "jobs": args.jobs,
        "median_s": round(median, 3),
        "chunks_per_s": round(args.n / median),
        "best_s": round(min(times), 3),
        "phases_s": {k: round(v, 3) for k, v in phases[times.index(median)].items()}
        if median in times
        else {},
        "folded_once": True,
        "leases_peak": max(peaks),
        "machine": f"{platform.machine()} {len(os.sched_getaffinity(0))} cores",
        "date": date.today().isoformat(),
    }


def main() -> None:
    """Parse arguments, run, print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--chunks-per-message", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
