"""Burst benchmark: N chunks of hyperparam_eval on an embedded fabric; one JSON line per N.

Workers (simulated GPUs) and the server are started before timing; `total_s` is the whole
`Fabric.run` call: spec published, leases acquired, chunks submitted, executed, results
aggregated, leases released, consumer deleted.

    python bench/burst.py                 # N=1000 and N=10000, 5 runs each, medians
    python bench/burst.py --n 1000 --runs 3
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


async def bench(
    fleet: LocalFleet, sizes: list[int], runs: int, slices: int
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
            samples = []
            for r in range(runs):
                job = Job(HYPERPARAM_EVAL, inputs, job_id=f"b{n}r{r}t{time.time_ns()}")
                result = await fabric.run(job, ArgMin(), slices=slices, timeout_s=120)
                assert result.n_ok == n, f"{result.n_failed} chunks failed"
                samples.append(result)
                # Let adverts show the released leases before the next acquire.
                await fabric.fleet.wait_changed(timeout_s=1.0)
            phases = {
                k: round(statistics.median(s.phases_s[k] for s in samples), 4)
                for k in samples[0].phases_s
            }
            totals = [s.phases_s["total_s"] for s in samples]
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
    args = parser.parse_args()
    with LocalFleet(workers=args.workers, simulate=args.simulate, slice_size="512MiB") as fleet:
        for line in asyncio.run(bench(fleet, args.n or [1000, 10000], args.runs, args.slices)):
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
