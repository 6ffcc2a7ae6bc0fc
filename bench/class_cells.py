"""A class on a few GPUs: 30 students looping short cells on 8 slices, with auth on.

Each student is a tenant of its own (a generated tenants file, its own connection) and
loops for `--seconds`: enter `fabric.gpu()` (waiting for a slice as long as it takes), run
one cell (`--cell-s` of sleep: the slices, not this machine's 2 cores, are what is shared),
leave. Beside it, in the same run, what a course would use instead on one machine: one
`concurrent.futures.ProcessPoolExecutor` of 8 processes that every student submits its
cells to (first come, first served, no tenants). One JSON line each: cells per second
(the ideal is slices / cell_s), per-student min and max cells, failed cells, and the wait
for a slice (median, p90, max).

    python bench/class_cells.py [--students 30] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from vramfabric.broker.errors import VramfabricError
from vramfabric.coordinator import CoordinatorSettings, Fabric
from vramfabric.local import LocalFleet, demo_tenants_file

SLICES = 8


def cell(student: int, cell_s: float) -> int:
    """One short cell: waits `cell_s` (as a GPU kernel would), returns the student's number."""
    time.sleep(cell_s)  # stands in for the cell's GPU work
    return student


def _summary(
    system: str, served: Counter[int], failed: int, waits: list[float], seconds: float, n: int
) -> dict[str, Any]:
    ordered = sorted(waits) or [0.0]
    counts = [served[i] for i in range(n)]
    return {
        "bench": "class_cells",
        "system": system,
        "students": n,
        "slices": SLICES,
        "cells": sum(counts),
        "cells_per_s": round(sum(counts) / seconds, 2),
        "per_student_min": min(counts),
        "per_student_max": max(counts),
        "failed": failed,
        "wait_median_s": round(statistics.median(ordered), 3),
        "wait_p90_s": round(ordered[int(len(ordered) * 0.9) - 1], 3),
        "wait_max_s": round(ordered[-1], 3),
    }


async def _fabric_class(
    fleet: LocalFleet, names: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    fabrics = [
        await Fabric.connect(
            fleet.broker_for(name), CoordinatorSettings(tenant=name, slice_bytes=2**30)
        )
        for name in names
    ]
    served: Counter[int] = Counter()
    waits: list[float] = []
    failed = 0
    t0 = time.monotonic()

    async def student(i: int) -> None:
        nonlocal failed
        while time.monotonic() - t0 < args.seconds:
            asked = time.monotonic()
            try:
                async with fabrics[i].gpu() as gpu:
                    waits.append(time.monotonic() - asked)
                    if await gpu.run(cell, i, args.cell_s) == i:
                        served[i] += 1
            except VramfabricError:  # recorded: a failed cell, counted
                failed += 1

    try:
        await asyncio.gather(*(student(i) for i in range(len(names))))
    finally:
        for fabric in fabrics:
            await fabric.close()
    return _summary("vramfabric", served, failed, waits, time.monotonic() - t0, len(names))


async def _pool_class(n: int, args: argparse.Namespace) -> dict[str, Any]:
    served: Counter[int] = Counter()
    waits: list[float] = []
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(SLICES) as pool:
        # Warm: every process started before the clock that counts.
        await asyncio.gather(*(loop.run_in_executor(pool, cell, 0, 0.0) for _ in range(SLICES)))
        t0 = time.monotonic()

        async def student(i: int) -> None:
            while time.monotonic() - t0 < args.seconds:
                asked = time.monotonic()
                if await loop.run_in_executor(pool, cell, i, args.cell_s) == i:
                    served[i] += 1
                # A pool shows no wait of its own: the time past the cell is the queue's.
                waits.append(max(0.0, time.monotonic() - asked - args.cell_s))

        await asyncio.gather(*(student(i) for i in range(n)))
    return _summary("process_pool_8", served, 0, waits, time.monotonic() - t0, n)


def main() -> int:
    """Run the class on the fabric, then on a process pool; print one JSON line each."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--students", type=int, default=30)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--cell-s", type=float, default=0.2)
    args = p.parse_args()
    if args.students < 1 or args.seconds <= 0 or args.cell_s < 0:
        p.error("--students must be 1 or more, --seconds above 0, --cell-s 0 or more")
    names = [f"student{i:02d}" for i in range(args.students)]
    common = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cell_s": args.cell_s,
        "ideal_cells_per_s": round(SLICES / args.cell_s, 2) if args.cell_s else None,
        "date": time.strftime("%Y-%m-%d"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = demo_tenants_file(Path(tmp) / "tenants.toml", tuple(names), allow_code=True)
        # Two nodes of one 4 GiB GPU in 1 GiB slices: 8 slices. Room for an executor per
        # student on each GPU: the bench is about sharing slices, not executor starts.
        fleet = LocalFleet(
            workers=2,
            simulate="1x4GiB",
            slice_size="1GiB",
            tenants_file=str(path),
            worker_args=("--allow-code",),
        )
        os.environ["VRAMFABRIC_MAX_EXECUTORS_PER_GPU"] = str(args.students + 1)  # workers read it
        with fleet:
            fabric = asyncio.run(_fabric_class(fleet, names, args))
    print(json.dumps({**fabric, **common}), flush=True)
    pool = asyncio.run(_pool_class(args.students, args))
    print(json.dumps({**pool, **common}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
