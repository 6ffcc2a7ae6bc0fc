"""Jobs after the fleet sat idle: do its executors wait for them? One JSON line.

An embedded fabric of 2 simulated workers (`--allow-code`, 1x80GiB each: 320 leases) runs
`--warm` jobs of 1,000 tiny chunks (compare.py's: the demo kernel's NumPy reference, about
0.2 ms each, as a Python function, so each lease gets a lane), sits idle `--gap-s`, then
runs `--jobs` more. Once with the workers' default executor idle time (600 s on simulated
GPUs) and once with `VRAMFABRIC_EXECUTOR_IDLE_S=30` (the real-GPU default): a gap longer
than the idle time stops the lanes, and the jobs after it start them again.

    python bench/after_idle.py                 # 45 s gap, 4 jobs before and after
    python bench/after_idle.py --gap-s 5 --jobs 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import struct
import time
import uuid
from typing import Any

import numpy as np

from vramfabric.coordinator import ArgMin, CoordinatorSettings, Fabric, Job
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space
from vramfabric.local import LocalFleet

IDLE_VARIABLE = "VRAMFABRIC_EXECUTOR_IDLE_S"


def loss(config: bytes) -> float:
    """One configuration's loss, as the demo kernel's NumPy reference computes it."""
    return float(struct.unpack("<f", HYPERPARAM_EVAL.run(np, {}, config)[:4])[0])


async def jobs(fabric: Fabric, n: int, configs: list[bytes]) -> list[float]:
    """Run `n` jobs one after another; each one's seconds (the whole `Fabric.run`)."""
    seconds = []
    for _ in range(n):
        t = time.perf_counter()
        result = await fabric.run(Job(loss, configs, job_id=uuid.uuid4().hex[:12]), ArgMin())
        seconds.append(round(time.perf_counter() - t, 3))
        assert result.n_ok == len(configs), result.failures
    return seconds


async def case(idle_s: str | None, warm: int, n_jobs: int, gap_s: float) -> dict[str, Any]:
    """One fleet with the workers' executor idle time `idle_s` (None: their default)."""
    if idle_s is None:
        os.environ.pop(IDLE_VARIABLE, None)
    else:
        os.environ[IDLE_VARIABLE] = idle_s  # the workers' environment is this process's
    configs = [encode_config(*c) for c in search_space(1000)]
    fleet = LocalFleet(workers=2, simulate="1x80GiB", worker_args=("--allow-code",))
    await asyncio.to_thread(fleet.start)
    try:
        settings = CoordinatorSettings(slice_bytes=512 * 2**20, job_retention_s=0)
        async with await Fabric.connect(fleet.broker, settings) as fabric:
            before = await jobs(fabric, warm, configs)
            await asyncio.sleep(gap_s)  # the idle time under test, not a synchronisation
            after = await jobs(fabric, n_jobs, configs)
    finally:
        await asyncio.to_thread(fleet.stop)
    return {"executor_idle_s": idle_s or "default", "before_gap_s": before, "after_gap_s": after}


async def run(warm: int, n_jobs: int, gap_s: float) -> list[dict[str, Any]]:
    """Both cases, the default first."""
    return [await case(idle_s, warm, n_jobs, gap_s) for idle_s in (None, "30")]


def main() -> None:
    """Parse flags, run, print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=4, help="jobs before the gap")
    parser.add_argument("--jobs", type=int, default=4, help="jobs after the gap")
    parser.add_argument("--gap-s", type=float, default=45.0)
    args = parser.parse_args()
    cases = asyncio.run(run(args.warm, args.jobs, args.gap_s))
    line = {
        "bench": "after_idle",
        "chunks": 1000,
        "gap_s": args.gap_s,
        "cases": cases,
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
