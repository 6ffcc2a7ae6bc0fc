"""Interactive calls against a Ray actor (issue 31): a no-op's round trip, warm and at ready.

- `vramfabric`: `gpu.run(nothing, i)` in one `with fabric.gpu() as gpu:` block, through
  `vramfabric.connect()` to an embedded fabric of one simulated worker that runs code (the
  setup of bench/gpu_calls.py).
- `ray_actor`: `ray.get(actor.f.remote(i))` on one actor of a local Ray of 2 CPUs.

Warm: both up at once, each warmed with `--warmup` calls, then `--rounds` rounds of
`--calls / --rounds` calls each, the systems alternated; median and p95 in milliseconds, and
the fabric's CPU per call by process (this one, nats-server, agent, executors; psutil).
First second: `--fresh` times each, alternated, a fresh one is started: a LocalFleet, ready
when `start()` returns; Ray, ready when `ray.init()` returns. At once the client connects
(the fabric's `connect()` and `gpu()` block; Ray's actor made) and calls one after another
until 1 s past ready. Reported: the median and p95 of the calls that started within that
second, how many did (per start), and the time from ready to the first result. One JSON
line per system, then one line of ratios (the fabric's figure over Ray's).

    python bench/calls_vs_actor.py                 # 600 warm calls each, 3 fresh starts each
    python bench/calls_vs_actor.py --calls 300 --fresh 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from batched import KINDS, snapshot  # bench/ is this script's folder, first on sys.path

from vramfabric.coordinator import CoordinatorSettings
from vramfabric.local import LocalFleet

# The client's modules load here, before any clock starts, as Ray's do (`import ray` is
# timed by neither): `vramfabric.connect` would load them on first use.
from vramfabric.sync import connect

SETTINGS = CoordinatorSettings(slice_bytes=2**30)
WINDOW_S = 1.0  # the first second after ready

Call = Callable[[int], object]


def nothing(x: int) -> int:
    """The called function: a no-op, so each system's own costs show."""
    return x


def _ms(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    if not ordered:
        return {"median_ms": None, "p95_ms": None, "calls": 0}
    return {
        "median_ms": round(statistics.median(ordered) * 1e3, 3),
        "p95_ms": round(ordered[math.ceil(0.95 * len(ordered)) - 1] * 1e3, 3),
        "calls": len(ordered),
    }


@contextmanager
def fabric_calls(fleet: LocalFleet) -> Iterator[Call]:
    """`gpu.run(nothing, x)` in one gpu block of a fabric connected to `fleet`."""
    with connect(fleet.broker, SETTINGS) as fabric, fabric.gpu() as gpu:
        yield lambda x: gpu.run(nothing, x)


def start_ray() -> Any:
    """Ray started (2 CPUs), and its no-op actor class."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    # Ray is the optional bench extra: where it is missing (CI) its decorator is untyped.
    @ray.remote  # type: ignore[untyped-decorator, unused-ignore]
    class Noop:
        def f(self, x: int) -> int:
            return x

    return ray, Noop


def ray_calls(ray: Any, actor_class: Any) -> Call:
    """A fresh actor's round trip: `ray.get(actor.f.remote(x))`."""
    actor = actor_class.remote()
    return lambda x: ray.get(actor.f.remote(x))


def timed(call: Call, n: int) -> list[float]:
    """Seconds of each of `n` calls, one after another."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        call(i)
        out.append(time.perf_counter() - t0)
    return out


def warm(args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Both systems up; after warm-up, alternated rounds of timed calls.

    Also the fabric's CPU per warm call in microseconds, by process kind: this process (the
    caller's coordinator, both its threads) and the fleet's nats-server, agent and executors.
    """
    fleet = LocalFleet(workers=1, simulate="1x8GiB", worker_args=("--allow-code",))
    ray, noop = start_ray()
    cpu_s = dict.fromkeys(KINDS, 0.0)
    try:
        with fleet, fabric_calls(fleet) as fabric_call:
            calls = {"vramfabric": fabric_call, "ray_actor": ray_calls(ray, noop)}
            for call in calls.values():
                timed(call, args.warmup)
            times: dict[str, list[float]] = {name: [] for name in calls}
            names = list(calls)
            for r in range(args.rounds):
                for name in names[r % 2 :] + names[: r % 2]:
                    before, own0 = snapshot(), time.process_time()
                    times[name] += timed(calls[name], args.calls // args.rounds)
                    if name == "vramfabric":
                        cpu_s["coordinator"] += time.process_time() - own0
                        for key, (kind, seconds) in snapshot().items():
                            cpu_s[kind] += seconds - before.get(key, (kind, 0.0))[1]
    finally:
        ray.shutdown()
    n = len(times["vramfabric"])
    return times, {kind: round(s / n * 1e6) for kind, s in cpu_s.items()}


def first_second(ready: float, connect: Callable[[], Call]) -> tuple[list[float], float]:
    """Calls made at once after `ready` (perf_counter): those started within 1 s, 1st result."""
    call = connect()
    samples: list[float] = []
    first_result_s = math.nan
    i = 0
    while (t0 := time.perf_counter()) - ready < WINDOW_S or i == 0:
        call(i)
        t1 = time.perf_counter()
        if i == 0:
            first_result_s = t1 - ready
        if t0 - ready < WINDOW_S:
            samples.append(t1 - t0)
        i += 1
    return samples, first_result_s


def fresh_fabric() -> tuple[list[float], float, float]:
    """A fleet started now: its calls in the first second, first result, seconds to ready."""
    fleet = LocalFleet(workers=1, simulate="1x8GiB", worker_args=("--allow-code",))
    t0 = time.perf_counter()
    with fleet:  # started on entry
        ready = time.perf_counter()
        with fabric_calls(fleet) as call:
            samples, first_s = first_second(ready, lambda: call)
    return samples, first_s, ready - t0


def fresh_ray() -> tuple[list[float], float, float]:
    """Ray started now: its actor's calls in the first second, first result, to ready."""
    t0 = time.perf_counter()
    ray, noop = start_ray()
    ready = time.perf_counter()
    try:
        samples, first_s = first_second(ready, lambda: ray_calls(ray, noop))
    finally:
        ray.shutdown()
    return samples, first_s, ready - t0


def main() -> None:
    """Time warm calls and first-second calls of both; print the JSON lines."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=600, help="timed warm calls per system")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fresh", type=int, default=3, help="fresh starts per system")
    args = p.parse_args()
    warm_s, cpu_us = warm(args)
    starts = {"vramfabric": fresh_fabric, "ray_actor": fresh_ray}
    fresh: dict[str, list[tuple[list[float], float, float]]] = {name: [] for name in starts}
    names = list(starts)
    for r in range(args.fresh):
        for name in names[r % 2 :] + names[: r % 2]:
            fresh[name].append(starts[name]())
    stamp = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "load_1m": round(os.getloadavg()[0], 2),
        "date": time.strftime("%Y-%m-%d"),
    }
    lines: dict[str, dict[str, Any]] = {}
    for name in names:
        runs = fresh[name]
        lines[name] = {
            "bench": "calls_vs_actor",
            "system": name,
            "warm": _ms(warm_s[name])
            | ({"cpu_us_per_call": cpu_us} if name == "vramfabric" else {}),
            "first_second": {
                **_ms([s for samples, _, _ in runs for s in samples]),
                "calls_per_start": [len(samples) for samples, _, _ in runs],
                "first_result_ms": round(statistics.median(r[1] for r in runs) * 1e3, 1),
                "first_result_ms_per_start": [round(r[1] * 1e3, 1) for r in runs],
                "start_to_ready_s": round(statistics.median(r[2] for r in runs), 2),
            },
            **stamp,
        }
        print(json.dumps(lines[name]), flush=True)
    vf, ray = lines["vramfabric"], lines["ray_actor"]
    ratios = {
        f"{phase}_{key}": round(vf[phase][key] / ray[phase][key], 2)
        for phase in ("warm", "first_second")
        for key in ("median_ms", "p95_ms")
        if vf[phase][key] and ray[phase][key]
    }
    ratios["first_result"] = round(
        vf["first_second"]["first_result_ms"] / ray["first_second"]["first_result_ms"], 2
    )
    print(json.dumps({"bench": "calls_vs_actor", "ratios": ratios, **stamp}), flush=True)


if __name__ == "__main__":
    main()
