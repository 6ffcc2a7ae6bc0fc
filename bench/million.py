"""Million-chunk benchmark: a job from a generator on an embedded fabric; one JSON line per N.

Each N runs the built-in hyperparam_eval over a generator of tiny chunks (12 bytes in, 4 out)
on simulated workers, folding with ArgMin. The coordinator runs in this process and the
workers and the server are subprocesses, so this process's peak RSS is the coordinator's.
Peak RSS is a high-water mark, so run each N in its own process (the default does).

    python bench/million.py                      # N=100000, then N=1000000 (each in a child)
    python bench/million.py --n 1000000 --here   # one N in this process
    python bench/million.py --n 100000 --list    # inputs as a list, not a generator
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator

from vramfabric.coordinator import ArgMin, CoordinatorSettings, Fabric, Job
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space
from vramfabric.local import LocalFleet


def _rss_mb() -> float:
    """This process's peak resident set size so far, in MB (VmHWM; Linux reports KiB).

    Not `ru_maxrss`: Linux carries that across exec, so a process a big parent forked (a
    pytest that ran a thousand tests) would report the parent's size as its own.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _configs(n: int) -> Iterator[bytes]:
    """N chunk inputs cycling over the demo's 1000 configurations, made one at a time."""
    grid = [encode_config(*c) for c in search_space(1000)]
    return (grid[i % 1000] for i in range(n))


async def _watch(fabric: Fabric, t0: float, stop: asyncio.Event) -> None:
    """Print progress to stderr every 10 s, so a stall shows while the run goes on."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 10.0)
        except TimeoutError:
            done = fabric.metrics.value("chunks_done_total")
            print(
                f"{time.perf_counter() - t0:7.1f}s done={done:.0f} rss={_rss_mb():.0f}MB",
                file=sys.stderr,
                flush=True,
            )


async def bench(fleet: LocalFleet, n: int, slices: int, as_list: bool) -> dict[str, object]:
    """Run one job of `n` chunks and describe it."""
    settings = CoordinatorSettings(slice_bytes=512 * 2**20, max_slices=slices)
    async with await Fabric.connect(fleet.broker, settings) as fabric:
        # Warm the workers (executors started, data set built) before timing.
        warm = Job(HYPERPARAM_EVAL, list(_configs(100)), job_id=f"warm{time.time_ns()}")
        await fabric.run(warm, ArgMin())
        await fabric.fleet.wait_changed(timeout_s=1.0)
        rss_before = _rss_mb()
        inputs = list(_configs(n)) if as_list else _configs(n)
        job = Job(HYPERPARAM_EVAL, inputs, job_id=f"m{n}t{time.time_ns()}")
        stop = asyncio.Event()
        t0 = time.perf_counter()
        watcher = asyncio.get_running_loop().create_task(_watch(fabric, t0, stop))
        try:
            result = await fabric.run(job, ArgMin(), slices=slices, timeout_s=3600)
        finally:
            stop.set()
            await watcher
        total_s = time.perf_counter() - t0
    assert result.n_ok == n, f"{result.n_failed} chunks failed"
    return {
        "bench": "million",
        "n": n,
        "inputs": "list" if as_list else "generator",
        "workers": fleet.workers,
        "leases_peak": result.leases_peak,
        "submit_window": getattr(settings, "submit_window", None),
        "total_s": round(total_s, 2),
        "us_per_chunk": round(total_s / n * 1e6, 1),
        "chunks_per_s": round(n / total_s, 1),
        "phases_s": {k: round(v, 3) for k, v in result.phases_s.items()},
        "coordinator_peak_rss_mb": round(_rss_mb(), 1),
        "coordinator_rss_before_job_mb": round(rss_before, 1),
        "value": result.value,
        "machine": f"{platform.machine()} {os.cpu_count()} cores "
        f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> int:
    """Parse flags; run each N in a child process (fresh peak RSS) unless --here."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, action="append", help="chunks (default 1e5 and 1e6)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slices", type=int, default=16)
    parser.add_argument("--simulate", default="1x8GiB", help="GPUs per worker")
    parser.add_argument("--list", action="store_true", help="inputs as a list")
    parser.add_argument("--here", action="store_true", help="run one N in this process")
    args = parser.parse_args()
    sizes = args.n or [100_000, 1_000_000]
    if not args.here:
        for n in sizes:
            cmd = [sys.executable, __file__, "--here", "--n", str(n)]
            cmd += ["--workers", str(args.workers), "--slices", str(args.slices)]
            cmd += ["--simulate", args.simulate] + (["--list"] if args.list else [])
            subprocess.run(cmd, check=True)
        return 0
    with LocalFleet(workers=args.workers, simulate=args.simulate, slice_size="512MiB") as fleet:
        line = asyncio.run(bench(fleet, sizes[0], args.slices, args.list))
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
