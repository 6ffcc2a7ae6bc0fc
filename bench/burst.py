"""Burst benchmark: N chunks of hyperparam_eval on an embedded fabric; one JSON line per N.

Workers (simulated GPUs) and the server are started before timing; `total_s` is the whole
`Fabric.run` call: spec published, leases acquired, chunks submitted, executed, results
aggregated, leases released, consumer deleted.

    python bench/burst.py                 # N=1000 and N=10000, 5 runs each, medians
    python bench/burst.py --n 1000 --runs 3
    python bench/burst.py --n 10000 --cpu  # plus CPU µs per chunk of each kind of process
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

from vramfabric.coordinator import ArgMin, CoordinatorSettings, Fabric, Job
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space
from vramfabric.local import LocalFleet

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def _children(pid: int) -> list[int]:
    """The direct children of a process (its executors, for a worker)."""
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(k) for k in f.read().split()]
    except OSError:
        pass
    return kids


def _cpu_by_role(fleet: LocalFleet) -> dict[str, dict[int, float]]:
    """CPU seconds so far of every process of the fabric, by role and pid."""
    agents = [p.pid for p in fleet.procs]
    server = fleet.server.pid if fleet.server else None
    return {
        "coordinator": {os.getpid(): _cpu_s(os.getpid())},
        "nats_server": {server: _cpu_s(server)} if server else {},
        "agents": {pid: _cpu_s(pid) for pid in agents},
        "executors": {kid: _cpu_s(kid) for pid in agents for kid in _children(pid)},
    }


def _cpu_us_per_chunk(
    before: dict[str, dict[int, float]], after: dict[str, dict[int, float]], n: int
) -> dict[str, float]:
    """CPU µs per chunk by role between two readings (processes started meanwhile from 0)."""
    used = {
        role: sum(s - before[role].get(pid, 0.0) for pid, s in after[role].items())
        for role in after
    }
    used["total"] = sum(used.values())
    return {role: round(s / n * 1e6, 1) for role, s in used.items()}


async def bench(
    fleet: LocalFleet, sizes: list[int], runs: int, slices: int, cpu: bool = False
) -> list[dict[str, object]]:
    """Run each size `runs` times (after one warm-up) and summarise with medians."""
    configs = [encode_config(*c) for c in search_space(1000)]
    settings = CoordinatorSettings(slice_bytes=512 * 2**20, max_slices=slices)
    lines = []
    async with await Fabric.connect(fleet.broker, settings) as fabric:
        await fabric.run(
            Job(HYPERPARAM_EVAL, configs[:100], job_id=f"warm{time.time_ns()}"), ArgMin()
        )
        for n in sizes:
            inputs = [configs[i % 1000] for i in range(n)]
            samples, cpu_samples = [], []
            for r in range(runs):
                job = Job(HYPERPARAM_EVAL, inputs, job_id=f"b{n}r{r}t{time.time_ns()}")
                before = _cpu_by_role(fleet) if cpu else {}
                result = await fabric.run(job, ArgMin(), slices=slices, timeout_s=120)
                if cpu:
                    cpu_samples.append(_cpu_us_per_chunk(before, _cpu_by_role(fleet), n))
                assert result.n_ok == n, f"{result.n_failed} chunks failed"
                samples.append(result)
                # Let adverts show the released leases before the next acquire.
                await fabric.fleet.wait_changed(timeout_s=1.0)
            phases = {
                k: round(statistics.median(s.phases_s[k] for s in samples), 4)
                for k in samples[0].phases_s
            }
            totals = [s.phases_s["total_s"] for s in samples]
            extra: dict[str, object] = {}
            if cpu:
                extra["cpu_us_per_chunk_median"] = {
                    role: round(statistics.median(c[role] for c in cpu_samples), 1)
                    for role in cpu_samples[0]
                }
                extra["load_avg_1m"] = round(os.getloadavg()[0], 2)
            lines.append(
                {
                    "bench": "burst",
                    "n": n,
                    "runs": runs,
                    "workers": fleet.workers,
                    "leases_peak_median": statistics.median(s.leases_peak for s in samples),
                    "phases_s": phases,
                    "total_s_median": round(statistics.median(totals), 4),
                    "total_s_min": round(min(totals), 4),
                    "total_s_max": round(max(totals), 4),
                    "chunks_per_s": round(n / statistics.median(totals), 1),
                    **extra,
                    "machine": f"{platform.machine()} {os.cpu_count()} cores "
                    f"Python {platform.python_version()}",
                    "date": time.strftime("%Y-%m-%d"),
                }
            )
    return lines


def main() -> int:
    """Parse flags, start the fleet, print one JSON line per size."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--n", type=int, action="append", help="chunk counts (default 1000 and 10000)"
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slices", type=int, default=1000)
    parser.add_argument("--simulate", default="4x80GiB", help="GPUs per worker (as the demo)")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="also print CPU µs per chunk of the coordinator, server, agents and executors",
    )
    args = parser.parse_args()
    with LocalFleet(workers=args.workers, simulate=args.simulate, slice_size="512MiB") as fleet:
        for line in asyncio.run(
            bench(fleet, args.n or [1000, 10000], args.runs, args.slices, args.cpu)
        ):
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
