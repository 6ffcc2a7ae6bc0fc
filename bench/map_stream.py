"""fabric.map over a generator: first result, throughput and the coordinator's peak RSS.

The coordinator (this process, through `vramfabric.connect()`) maps a trivial function over
a generator of N items on an embedded fabric of simulated workers that run code. It prints
one JSON line: how many items had been read when the first result arrived, whether the
generator was exhausted by then, seconds to the first result and in all, and this process's
peak RSS (a high-water mark: run one N per process).

    python bench/map_stream.py --n 100000
    python bench/map_stream.py --n 100000 --url nats://... --prefix vf   # an existing fabric
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Iterator

import vramfabric
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import CoordinatorSettings
from vramfabric.local import LocalFleet


def inc(x: int) -> int:
    """The mapped function: trivial, so the fabric's own costs show."""
    return x + 1


def rss_mb() -> float:
    """This process's peak resident set size so far, in MB (VmHWM; Linux reports KiB).

    Not `ru_maxrss`: Linux carries that across exec, so a process a big parent forked (a
    pytest that ran a thousand tests) would report the parent's size as its own.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run(broker: BrokerSettings, n: int, slices: int) -> dict[str, object]:
    """Map over N items; describe the run."""
    read = {"items": 0, "exhausted": False}

    def items() -> Iterator[int]:
        for i in range(n):
            read["items"] = i + 1
            yield i
        read["exhausted"] = True

    settings = CoordinatorSettings(slice_bytes=512 * 2**20, max_slices=slices)
    t0 = time.perf_counter()
    first: dict[str, object] = {}
    total = 0
    with vramfabric.connect(broker, settings) as fabric:
        for value in fabric.map(inc, items(), slices=slices):
            if not first:
                first = {
                    "first_result_s": round(time.perf_counter() - t0, 3),
                    "read_at_first": read["items"],
                    "exhausted_at_first": read["exhausted"],
                }
            total += value
    elapsed = time.perf_counter() - t0
    assert total == n * (n + 1) // 2, "a result is missing or repeated"
    return {
        "bench": "map_stream",
        "n": n,
        **first,
        "elapsed_s": round(elapsed, 1),
        "us_per_item": round(elapsed / n * 1e6),
        "peak_rss_mb": round(rss_mb(), 1),
        "slices": slices,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> int:
    """Parse arguments, run on an embedded fabric unless given one, print one JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--slices", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--url", help="an existing fabric's NATS URL (its workers must run code)")
    p.add_argument("--prefix", default="vf")
    args = p.parse_args()
    if args.url:
        out = run(BrokerSettings(url=args.url, prefix=args.prefix), args.n, args.slices)
    else:
        fleet = LocalFleet(workers=args.workers, simulate="1x8GiB", worker_args=("--allow-code",))
        with fleet:
            out = run(fleet.broker, args.n, args.slices)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
