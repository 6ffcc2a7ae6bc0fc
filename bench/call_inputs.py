"""Calls with large arguments: `gpu.run(f, data)` against a Ray actor's `f.remote(data)`.

A call's arguments past a message's size (about 1 MiB) go through the tenant's kernels store
(broker/calls.py, `CallRequest.input_ref`). Here `f` returns the length of the bytes it got,
so the time is the argument's way in; each size is timed `--calls` times per system, the
systems alternated call by call: an embedded fabric (one simulated worker that runs code,
`vramfabric.connect()`, one `fabric.gpu()` block) and one actor of a local Ray of 2 CPUs
(`--no-ray` leaves it out). One JSON line per system and size: median and p90 in ms, MB/s.

    python bench/call_inputs.py                    # 0.5, 5 and 32 MiB, 10 calls each
    python bench/call_inputs.py --mib 5 --calls 20 --no-ray
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from calls_vs_actor import SETTINGS  # bench/ is this script's folder, first on sys.path

from vramfabric.local import LocalFleet
from vramfabric.sync import connect

Call = Callable[[bytes], int]


def length(data: bytes) -> int:
    """The called function: what came in, so nothing but the argument's way in is timed."""
    return len(data)


def ray_call() -> tuple[Any, Call]:
    """Ray started (2 CPUs) and a call of its actor's `length`."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    # Ray is the optional bench extra: where it is missing (CI) its decorator is untyped.
    @ray.remote  # type: ignore[untyped-decorator, unused-ignore]
    class Lengths:
        def f(self, data: bytes) -> int:
            return len(data)

    actor_class: Any = Lengths  # the decorator made it a Ray actor class
    actor = actor_class.remote()
    return ray, lambda data: int(ray.get(actor.f.remote(data)))


def line(system: str, mib: float, samples: list[float]) -> dict[str, Any]:
    """One JSON line of a system's calls of one size."""
    ordered = sorted(samples)
    median = statistics.median(ordered)
    return {
        "bench": "call_inputs",
        "system": system,
        "input_mib": mib,
        "median_ms": round(median * 1e3, 2),
        "p90_ms": round(ordered[max(0, int(len(ordered) * 0.9) - 1)] * 1e3, 2),
        "mb_per_s": round(mib * 2**20 / median / 1e6, 1),
        "calls": len(ordered),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    """Time each size's calls on both systems, alternated; print the JSON lines."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, action="append", help="argument size (repeatable)")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--no-ray", dest="ray", action="store_false")
    args = p.parse_args()
    sizes = args.mib or [0.5, 5.0, 32.0]
    fleet = LocalFleet(workers=1, simulate="1x8GiB", worker_args=("--allow-code",))
    ray = None
    with fleet, connect(fleet.broker, SETTINGS) as fabric, fabric.gpu() as gpu:
        calls: dict[str, Call] = {"vramfabric": lambda data: int(gpu.run(length, data))}
        if args.ray:
            ray, calls["ray_actor"] = ray_call()
        try:
            for mib in sizes:
                data = bytes(range(256)) * int(mib * 2**20 // 256)
                times: dict[str, list[float]] = {name: [] for name in calls}
                for call in calls.values():  # warm: the first call of a size is not timed
                    assert call(data) == len(data)
                for _ in range(args.calls):
                    for name, call in calls.items():
                        t0 = time.perf_counter()
                        got = call(data)
                        times[name].append(time.perf_counter() - t0)
                        assert got == len(data), f"{name}: {got} bytes came, not {len(data)}"
                for name, samples in times.items():
                    print(json.dumps(line(name, mib, samples)), flush=True)
        finally:
            if ray is not None:
                ray.shutdown()


if __name__ == "__main__":
    main()
