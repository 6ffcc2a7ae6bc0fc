"""Interactive calls: `with fabric.gpu()` entry to the first result, and `gpu.run` latency.

On an embedded fabric of simulated workers that run code, through `vramfabric.connect()`:
each of `--blocks` blocks is timed from entering `with fabric.gpu()` to the first result of
a trivial function (the lease, the executor's warm-up, the call), then `--calls` calls are
timed one by one in the last block. One JSON line: medians and p90s in milliseconds.

    python bench/gpu_calls.py
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import vramfabric
from vramfabric.coordinator import CoordinatorSettings
from vramfabric.local import LocalFleet


def nothing(x: int) -> int:
    """The called function: trivial, so the fabric's own costs show."""
    return x


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1e3, 2),
        "p90_ms": round(ordered[int(len(ordered) * 0.9) - 1] * 1e3, 2),
    }


def main() -> int:
    """Time the blocks and calls; print one JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--calls", type=int, default=500)
    args = p.parse_args()
    fleet = LocalFleet(workers=1, simulate="1x8GiB", worker_args=("--allow-code",))
    settings = CoordinatorSettings(slice_bytes=2**30)
    entries, calls = [], []
    with fleet, vramfabric.connect(fleet.broker, settings) as fabric:
        with fabric.gpu() as gpu:  # uploads the call's work once: not timed
            gpu.run(nothing, 0)
        for _ in range(args.blocks):
            t0 = time.perf_counter()
            with fabric.gpu() as gpu:
                gpu.run(nothing, 1)
                entries.append(time.perf_counter() - t0)
        with fabric.gpu() as gpu:
            for i in range(args.calls):
                t0 = time.perf_counter()
                gpu.run(nothing, i)
                calls.append(time.perf_counter() - t0)
    out = {
        "bench": "gpu_calls",
        "entry_to_first_result": _ms(entries),
        "call": _ms(calls),
        "blocks": args.blocks,
        "calls": args.calls,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
