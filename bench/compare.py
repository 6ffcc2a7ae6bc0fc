"""Compare: the same job through vramfabric, Ray and bare JetStream, alternating; JSON lines.

The job is the demo's search: tiny hyperparameter chunks (one 12-byte configuration in, one
float32 loss out), `--n` of them, and the argmin. Each system computes a chunk with the same
function, with two worker processes; `--chunk` picks it: `reference` (the default, as issue
17 measured) runs the demo kernel's NumPy reference (about 0.2 ms), `host` its CUDA source
compiled for the CPU (kernels/host.py, about 0.5 ms), which a simulated worker runs for the
registered kernel.

- vramfabric: an embedded fabric (LocalFleet, 2 workers, `--allow-code`) running the function
  as a job; a job is the whole `Fabric.run` (spec, leases, submit, execute, aggregate,
  release). `vramfabric` packs tiny chunks (the default, auto); `vramfabric_unpacked` sends
  one chunk per message (`chunks_per_message=1`), as the baseline does.
- bare JetStream: 2 worker processes pulling from a work-queue stream (streaming pull, a
  batch per request) and publishing each result into a results stream; the client
  publishes the chunks (core publishes the stream captures, no PubAck each) and folds the
  results as they come. No leases, retries, idempotency or failure handling: the floor.
- Ray (the optional `bench` extra): one task per chunk on a local Ray of 2 CPUs, `ray.get`.

Systems alternate within each round (`--rounds`), each running `--jobs` jobs of each size;
medians are printed, one JSON line per system and size, then one line of ratios. The time
each system takes to be ready (started until it can run a chunk) is measured once.

    python bench/compare.py                       # n = 1000 and 10000, 4 rounds x 3 jobs
    python bench/compare.py --n 1000 --rounds 2 --no-ray --chunk host
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import statistics
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from js_floor import Floor  # bench/ is this script's folder, first on sys.path

from vramfabric.broker.server import NatsServer
from vramfabric.coordinator import ArgMin, CoordinatorSettings, Fabric, Job
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space
from vramfabric.local import LocalFleet

WORKERS = 2
# Which computation a chunk runs (`--chunk`): set once, before any system starts.
CHUNK = ["reference"]


def reference_chunk(config: bytes) -> bytes:
    """A chunk as the demo kernel's NumPy reference computes it: the loss, float32 bytes."""
    return HYPERPARAM_EVAL.run(np, {}, config)


def reference_loss(config: bytes) -> float:
    """The chunk as a vramfabric job's function: the same loss, as a float."""
    return float(struct.unpack("<f", HYPERPARAM_EVAL.run(np, {}, config)[:4])[0])


def chunk_fn(kind: str) -> Callable[[bytes], bytes]:
    """One chunk's computation of `kind` (`--chunk`); worker processes are told it."""
    if kind == "host" and HYPERPARAM_EVAL.cuda is not None:
        return HYPERPARAM_EVAL.cuda().run_host
    return reference_chunk


def inputs(n: int) -> list[bytes]:
    """The job's chunk inputs: the 1000-configuration search space, repeated to `n`."""
    configs = [encode_config(*c) for c in search_space(1000)]
    return [configs[i % 1000] for i in range(n)]


def argmin(losses: dict[int, bytes]) -> int:
    """The chunk index of the smallest loss (NaN last)."""
    values = {i: struct.unpack("<f", out[:4])[0] for i, out in losses.items()}
    return min(values, key=lambda i: (np.isnan(values[i]), values[i], i))


# ---- bare JetStream ----------------------------------------------------------------------


class BareJetStream:
    """The floor: a work queue, two pulling workers, a results stream (js_floor.py)."""

    name = "bare_jetstream"

    def __init__(self, url: str) -> None:
        self.floor = Floor(url, "cmp", functools.partial(chunk_fn, CHUNK[0]), 64, WORKERS)

    async def start(self) -> None:
        """Streams, consumer and worker processes; returns once the workers pull."""
        await self.floor.start()

    async def job(self, data: list[bytes], _tag: str) -> int:
        """Publish the chunks, fold the results as they arrive; the argmin."""
        results: dict[int, bytes] = {}
        await self.floor.run(data, results.__setitem__)
        return argmin(results)

    async def stop(self) -> None:
        """Stop the workers and the client."""
        await self.floor.stop()


# ---- vramfabric --------------------------------------------------------------------------


class Vramfabric:
    """An embedded fabric of two simulated workers; a job is one `Fabric.run`."""

    def __init__(self, fleet: LocalFleet, packed: bool) -> None:
        self.fleet = fleet
        self.packed = packed
        self.name = "vramfabric" if packed else "vramfabric_unpacked"
        # Seconds from the first lease asked for to the last released, per job size.
        self.lease_spans: dict[int, list[float]] = {}

    async def start(self) -> None:
        """Start the workers if no other system did (the server is shared) and connect."""
        if not self.fleet.procs:
            await asyncio.to_thread(self.fleet.start)
        settings = CoordinatorSettings(
            slice_bytes=512 * 2**20, job_retention_s=0, chunks_per_message=0 if self.packed else 1
        )
        self.fabric = await Fabric.connect(self.fleet.broker, settings)

    async def warm(self) -> None:
        """One job first: executors up on every lease, the function loaded."""
        await self.job(inputs(1000), f"warm{self.packed:d}")
        self.lease_spans.clear()
        await self.settle()

    async def job(self, data: list[bytes], tag: str) -> int:
        """One whole run: leases, submit, execute, aggregate, release."""
        if CHUNK[0] == "host":
            job = Job(HYPERPARAM_EVAL, data, job_id=tag)
        else:
            job = Job(reference_loss, data, job_id=tag)
        result = await self.fabric.run(job, ArgMin())
        assert result.n_ok == len(data), f"{result.n_failed} chunks failed"
        phases = result.phases_s
        span = phases["acquire_s"] + phases["execute_s"] + phases["release_s"]
        self.lease_spans.setdefault(len(data), []).append(span)
        return int(result.value[0])

    async def settle(self) -> None:
        """Between jobs, not timed: the adverts show the released leases back."""
        await self.fabric.fleet.wait_changed(timeout_s=1.0)

    async def stop(self) -> None:
        """Close the client and stop the workers (once)."""
        await self.fabric.close()
        if self.fleet.procs:
            await asyncio.to_thread(self.fleet.stop)


# ---- Ray ---------------------------------------------------------------------------------


class Ray:
    """A local Ray of two CPUs; one task per chunk."""

    name = "ray"

    async def start(self) -> None:
        """Start Ray and warm its two workers with one task each."""
        import ray

        self.ray = ray
        ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)

        # Ray is the optional bench extra: where it is missing (CI) its decorator is untyped.
        @ray.remote  # type: ignore[untyped-decorator, unused-ignore]
        def evaluate(chunk: bytes, kind: str) -> bytes:
            return _ray_chunk(chunk, kind)

        self.evaluate = evaluate
        ray.get([evaluate.remote(b, CHUNK[0]) for b in inputs(WORKERS)])

    async def job(self, data: list[bytes], tag: str) -> int:
        """Submit every chunk as a task and wait for all."""
        tasks = [self.evaluate.remote(b, CHUNK[0]) for b in data]
        outs = await asyncio.to_thread(self.ray.get, tasks)
        return argmin(dict(enumerate(outs)))

    async def stop(self) -> None:
        """Shut Ray down."""
        self.ray.shutdown()


_RAY_FN: list[Callable[[bytes], bytes]] = []


def _ray_chunk(chunk: bytes, kind: str) -> bytes:
    """A chunk in a Ray worker: the computation built once per worker process."""
    if not _RAY_FN:
        _RAY_FN.append(chunk_fn(kind))
    return _RAY_FN[0](chunk)


# ---- the comparison ----------------------------------------------------------------------


async def compare(sizes: list[int], rounds: int, jobs: int, with_ray: bool) -> list[dict[str, Any]]:
    """Start each system, then alternate them; medians per system and size, and ratios."""
    with NatsServer() as server:
        fleet = LocalFleet(
            workers=WORKERS,
            simulate="1x80GiB",
            url=server.url,
            prefix="cmpvf",
            worker_args=("--allow-code",),
        )
        systems: list[Any] = [
            Vramfabric(fleet, packed=True),
            Vramfabric(fleet, packed=False),
            BareJetStream(server.url),
        ]
        if with_ray:
            systems.append(Ray())
        ready_s: dict[str, float] = {}
        for system in systems:
            t = time.perf_counter()
            await system.start()
            ready_s[system.name] = time.perf_counter() - t
            if hasattr(system, "warm"):
                await system.warm()
        try:
            times = await alternate(systems, sizes, rounds, jobs)
        finally:
            for system in systems:
                await system.stop()
    spans = {(s.name, n): v for s in systems for n, v in getattr(s, "lease_spans", {}).items()}
    return summary(times, ready_s, sizes, with_ray, spans)


async def alternate(
    systems: list[Any], sizes: list[int], rounds: int, jobs: int
) -> dict[tuple[str, int], list[float]]:
    """Each round, each system runs `jobs` jobs of each size; seconds per job, by both."""
    expected = {n: argmin(dict(enumerate(map(chunk_fn(CHUNK[0]), inputs(n))))) for n in sizes}
    times: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        for system in systems:
            for n in sizes:
                data = inputs(n)
                for j in range(jobs):
                    tag = f"c{n}r{r}j{j}t{time.time_ns()}"
                    t = time.perf_counter()
                    best = await system.job(data, tag)
                    times.setdefault((system.name, n), []).append(time.perf_counter() - t)
                    if hasattr(system, "settle"):
                        await system.settle()
                    assert best == expected[n], f"{system.name}: argmin {best}"
    return times


def summary(
    times: dict[tuple[str, int], list[float]],
    ready_s: dict[str, float],
    sizes: list[int],
    with_ray: bool,
    spans: dict[tuple[str, int], list[float]],
) -> list[dict[str, Any]]:
    """One line per system and size (medians), then the ratios per size."""
    stamp = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "chunk": CHUNK[0],
    }
    lines: list[dict[str, Any]] = []
    for (name, n), samples in sorted(times.items()):
        median = statistics.median(samples)
        lines.append(
            {
                "bench": "compare",
                "system": name,
                "n": n,
                "median_s": round(median, 4),
                "chunks_per_s": round(n / median),
                "ready_s": round(ready_s[name], 2),
                **(
                    {"lease_to_release_s": round(statistics.median(spans[(name, n)]), 4)}
                    if (name, n) in spans
                    else {}
                ),
                "samples": len(samples),
                **stamp,
            }
        )
    for n in sizes:
        bare = statistics.median(times[("bare_jetstream", n)])
        for name in ("vramfabric", "vramfabric_unpacked"):
            vf = statistics.median(times[(name, n)])
            ratios = {"of_bare_jetstream": round(bare / vf, 3)}
            if with_ray:
                ratios["times_ray"] = round(statistics.median(times[("ray", n)]) / vf, 2)
            lines.append({"bench": "compare", "n": n, "system": name, "speed": ratios, **stamp})
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append", help="chunks per job (repeatable)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=3, help="jobs per system, size and round")
    parser.add_argument("--no-ray", action="store_true", help="leave Ray out")
    parser.add_argument(
        "--chunk", choices=("reference", "host"), default="reference", help="what a chunk runs"
    )
    args = parser.parse_args()
    CHUNK[0] = args.chunk
    with_ray = not args.no_ray
    if with_ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            print(
                json.dumps(
                    {"bench": "compare", "note": "ray not installed: pip install '.[bench]'"}
                )
            )
            with_ray = False
    for line in asyncio.run(compare(args.n or [1000, 10_000], args.rounds, args.jobs, with_ray)):
        print(json.dumps(line))
