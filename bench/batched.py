"""Batched peers (issue 31): one job of tiny chunks, each system batched as a user would.

The job: `--n` hyperparameter configurations of a tiny loss (bench/packed.py's, about a
microsecond of Python each) and their argmin, checked against the one computed here (ties
to the lower configuration). A job is timed from handing over the configurations to holding
the checked argmin. Two worker processes in every system:

- `vramfabric`: an embedded fabric (LocalFleet, 2 simulated workers, `--allow-code`), one
  `Fabric.run` of one chunk per configuration, auto packing. Its CPU per chunk is measured
  too: user + sys seconds of this process (the coordinator) and of its descendants, by kind
  (nats-server, agent, executor; a process new during a job counts whole), over its jobs.
- `pool`: `multiprocessing.Pool(2).map(loss, configs, chunksize=n // 8)`, argmin here.
- `ray_<b>`: a local Ray of 2 CPUs, one task per batch of `n / b` configurations returning
  its (loss, config); the driver combines. Optional (`--no-ray`, or skipped if missing).
- `dask_<b>`: dask.distributed's LocalCluster (2 worker processes, 1 thread each), one task
  per batch, `client.map(..., pure=False)` (no cached results), gathered and combined.
- `jetstream`: bare JetStream, batched: 1,000 configurations a message (packed int64) on a
  work-queue stream, 2 worker processes pulling and publishing one (loss, config) per batch
  into a results stream, the client folding as they arrive. No leases or retries: the floor.

A job is timed by this process's clock around the call that runs it; the fabric's leaves out
the CPU snapshots taken before and after it (psutil, about 8 ms each with 19 processes).
Every system is warmed with one small job and one of each size; then each round runs
`--jobs` jobs of each size per system, the order rotated each round. One JSON line per
system and size (medians and p90s over rounds x jobs), then one line of ratios per size (the
fabric's median over each peer's; under 1: the fabric is faster).

    python bench/batched.py                        # n = 10,000 and 100,000; 5 rounds x 3 jobs
    python bench/batched.py --n 10000 --rounds 2 --jobs 2 --no-dask
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import multiprocessing as mp
import os
import platform
import statistics
import struct
import time
import uuid
from array import array
from collections.abc import Callable, Sequence
from multiprocessing.pool import Pool
from typing import Any, Protocol

import psutil  # type: ignore[import-untyped, unused-ignore]
from js_floor import Floor  # bench/ is this script's folder, first on sys.path

from vramfabric.broker.server import NatsServer
from vramfabric.coordinator import ArgMin, CoordinatorSettings, Fabric, Job
from vramfabric.local import LocalFleet

WORKERS = 2
BATCHES = (2, 8, 64)  # Ray's and Dask's batches per job
JS_BATCH = 1000  # configurations per JetStream message
WARM_N = 1000
KINDS = ("coordinator", "nats_server", "agent", "executor")


def loss(config: int) -> float:
    """The loss of configuration `config` (bench/packed.py's: a tiny chunk of work)."""
    lr, depth = (config % 997) / 997.0, config % 13
    return (lr - 0.4242) ** 2 + 0.01 * (depth - 7) ** 2


def best_of(configs: Sequence[int]) -> tuple[float, int]:
    """(loss, config) of the batch's smallest loss, ties to the lower configuration."""
    return min((loss(c), c) for c in configs)


def split(configs: list[int], batches: int) -> list[list[int]]:
    """`configs` cut into `batches` contiguous batches of near-equal size."""
    size = math.ceil(len(configs) / batches)
    return [configs[i : i + size] for i in range(0, len(configs), size)]


class System(Protocol):
    """A peer under test: `job` runs one job and gives the argmin's configuration."""

    name: str

    async def job(self, configs: list[int]) -> int:
        """Run one job of `configs`; the configuration of the smallest loss."""
        ...


# ---- vramfabric and its CPU ----------------------------------------------------------------


def kind_of(cmdline: list[str]) -> str | None:
    """Which of the fabric's processes this command line is; None: not the fabric's."""
    line = " ".join(cmdline)
    if "vramfabric.worker.executor" in line:
        return "executor"
    if "vramfabric.worker" in line:
        return "agent"
    if cmdline and os.path.basename(cmdline[0]).startswith("nats-server"):
        return "nats_server"
    return None


Snapshot = dict[tuple[int, float], tuple[str, float]]


def snapshot() -> Snapshot:
    """CPU seconds (user + sys) so far of every descendant of the fabric's, by (pid, start)."""
    found: Snapshot = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            kind = kind_of(proc.cmdline())
            if kind is not None:
                times = proc.cpu_times()
                found[(proc.pid, proc.create_time())] = (kind, times.user + times.system)
        except psutil.Error:  # gone while read: shows as exited in the count
            continue
    return found


class Vramfabric:
    """An embedded fabric; a job is one `Fabric.run`, its CPU added up by process kind."""

    name = "vramfabric"

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.cpu_s: dict[int, dict[str, float]] = {}  # by job size, then process kind
        self.jobs: dict[int, int] = {}
        self.exited = 0  # fabric processes that ended during a job: their CPU then is missed
        # The last job's own seconds: its CPU snapshots (psutil over some 19 processes, about
        # 8 ms each, two a job) are the bench's, not the user's wait, so they are not timed.
        self.job_s: float | None = None
        self.idle_cpu_share = 0.0  # of one core, used by this process with nothing running

    async def job(self, configs: list[int]) -> int:
        """One `Fabric.run` with auto packing; its CPU counted per process kind."""
        before = snapshot()
        own0, t0 = time.process_time(), time.perf_counter()
        argmin = await self.run(configs)
        self.job_s = time.perf_counter() - t0
        own_s = time.process_time() - own0
        after = snapshot()
        cpu_s = self.cpu_s.setdefault(len(configs), dict.fromkeys(KINDS, 0.0))
        cpu_s["coordinator"] += own_s
        for key, (kind, seconds) in after.items():
            cpu_s[kind] += seconds - before.get(key, (kind, 0.0))[1]
        self.exited += len(before.keys() - after.keys())
        self.jobs[len(configs)] = self.jobs.get(len(configs), 0) + 1
        return argmin

    async def run(self, configs: list[int]) -> int:
        """The job itself, a fresh job id each."""
        job = Job(loss, configs, job_id=f"batched-{uuid.uuid4().hex[:12]}")
        result = await self.fabric.run(job, ArgMin())
        assert result.n_ok == len(configs), f"{result.n_failed} chunks failed"
        assert result.value is not None
        return configs[int(result.value[0])]

    def cpu_us_per_chunk(self, n: int) -> dict[str, float]:
        """Microseconds of CPU per chunk over the jobs of size `n`, by kind and in total."""
        chunks = n * self.jobs[n]
        out = {kind: round(s / chunks * 1e6, 1) for kind, s in self.cpu_s[n].items()}
        out["total"] = round(sum(self.cpu_s[n].values()) / chunks * 1e6, 1)
        return out


# ---- multiprocessing, Ray, Dask --------------------------------------------------------------


class PoolMap:
    """`multiprocessing.Pool(2).map` in 8 chunks, the argmin taken here."""

    name = "pool"

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def job(self, configs: list[int]) -> int:
        """Map the loss over every configuration; the argmin."""
        losses = await asyncio.to_thread(self.pool.map, loss, configs, max(1, len(configs) // 8))
        return min(zip(losses, configs, strict=True))[1]


class RayBatches:
    """One Ray task per batch, each giving its batch's best; the driver combines."""

    def __init__(self, ray: Any, remote: Any, batches: int) -> None:
        self.ray, self.remote, self.batches = ray, remote, batches
        self.name = f"ray_{batches}"

    async def job(self, configs: list[int]) -> int:
        """Submit the batches, wait for all, combine."""
        refs = [self.remote.remote(batch) for batch in split(configs, self.batches)]
        outs: list[tuple[float, int]] = await asyncio.to_thread(self.ray.get, refs)
        return min(outs)[1]


def start_ray() -> tuple[Any, Any]:
    """A local Ray of 2 CPUs and the batch task."""
    import ray

    ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)

    # Ray is the optional bench extra: where it is missing (CI) its decorator is untyped.
    @ray.remote  # type: ignore[untyped-decorator, unused-ignore]
    def best_remote(configs: list[int]) -> tuple[float, int]:
        return best_of(configs)

    return ray, best_remote


class DaskBatches:
    """One Dask task per batch (`client.map`, not cached), gathered and combined."""

    def __init__(self, client: Any, batches: int) -> None:
        self.client, self.batches = client, batches
        self.name = f"dask_{batches}"

    async def job(self, configs: list[int]) -> int:
        """Map the batches, gather, combine."""
        return await asyncio.to_thread(self._job, configs)

    def _job(self, configs: list[int]) -> int:
        futures = self.client.map(best_of, split(configs, self.batches), pure=False)
        outs: list[tuple[float, int]] = self.client.gather(futures)
        return min(outs)[1]


def start_dask() -> Any:
    """A LocalCluster of 2 worker processes of 1 thread, and its client."""
    # Optional, and its constructors are untyped: used as Any.
    dd: Any = importlib.import_module("dask.distributed")
    cluster = dd.LocalCluster(
        n_workers=WORKERS, threads_per_worker=1, processes=True, dashboard_address=None
    )
    return dd.Client(cluster)


# ---- bare JetStream, batched -------------------------------------------------------------


def _best_of_batch(data: bytes) -> bytes:
    """A JetStream worker's work: the (loss, config) of a batch's best, packed."""
    return struct.pack("<dq", *best_of(array("q", data)))


def _batch_compute() -> Callable[[bytes], bytes]:
    return _best_of_batch


class JetStreamBatches:
    """A work-queue stream of batches, two pulling workers, a results stream (js_floor.py)."""

    name = "jetstream"

    def __init__(self, url: str) -> None:
        # 4 batches a fetch: 1 left workers idle on fetches (0.11-0.16 s a 100,000 job
        # against 0.06-0.07 s), 16 split a job's few batches unevenly.
        self.floor = Floor(url, "bat", _batch_compute, 4, WORKERS)

    async def start(self) -> None:
        """Streams, consumer and worker processes; returns once the workers pull."""
        await self.floor.start()

    async def job(self, configs: list[int]) -> int:
        """Publish the batches, fold the bests as they arrive; the argmin."""
        batches = split(configs, math.ceil(len(configs) / JS_BATCH))
        bests: list[tuple[float, int]] = []
        await self.floor.run(
            [array("q", batch).tobytes() for batch in batches],
            lambda _i, data: bests.append(struct.unpack("<dq", data)),
        )
        return int(min(bests)[1])

    async def stop(self) -> None:
        """Stop the workers and the client."""
        await self.floor.stop()


# ---- the run -------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, pool: Pool) -> list[dict[str, Any]]:
    """Start every system, warm each, alternate them; the JSON lines."""
    with NatsServer() as server:
        fleet = LocalFleet(
            workers=WORKERS, simulate="1x80GiB", url=server.url, worker_args=("--allow-code",)
        )
        settings = CoordinatorSettings(slice_bytes=512 * 2**20, job_retention_s=0)
        jetstream = JetStreamBatches(server.url)
        ray = client = fabric = None
        try:
            await asyncio.to_thread(fleet.start)
            fabric = Vramfabric(await Fabric.connect(fleet.broker, settings))
            systems: list[System] = [fabric, PoolMap(pool), jetstream]
            await jetstream.start()
            if args.ray:
                ray, remote = start_ray()  # in the main thread, as Ray expects
                systems += [RayBatches(ray, remote, b) for b in BATCHES]
            if args.dask:
                client = await asyncio.to_thread(start_dask)
                systems += [DaskBatches(client, b) for b in BATCHES]
            # Warm: processes up, code loaded, and a job of each size run, so the fabric's
            # executor lanes (one per lease, started as a job's leases first need them) are
            # all up before a job is timed, as after a session's first jobs.
            for system in systems:
                for n in [WARM_N, *args.n]:
                    await system.job(list(range(n)))
            fabric.cpu_s.clear()  # the warm job's CPU is not counted
            fabric.jobs.clear()
            fabric.exited = 0
            # This process also holds Ray's and Dask's clients: their threads' CPU while idle.
            own0 = time.process_time()
            await asyncio.sleep(1.0)
            fabric.idle_cpu_share = time.process_time() - own0
            times = await alternate(systems, args.n, args.rounds, args.jobs)
        finally:
            await jetstream.stop()
            if fabric is not None:
                await fabric.fabric.close()
            await asyncio.to_thread(fleet.stop)
            if ray is not None:
                ray.shutdown()
            if client is not None:
                client.close()
                client.cluster.close()
    return summary(times, fabric, args.n)


async def alternate(
    systems: list[System], sizes: list[int], rounds: int, jobs: int
) -> dict[tuple[str, int], list[float]]:
    """Each round, each system (order rotated) runs `jobs` jobs of each size; seconds each."""
    configs = {n: list(range(n)) for n in sizes}
    expected = {n: min(c, key=lambda c: (loss(c), c)) for n, c in configs.items()}
    times: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        for system in systems[r % len(systems) :] + systems[: r % len(systems)]:
            for n in sizes:
                for _ in range(jobs):
                    t0 = time.perf_counter()
                    best = await system.job(configs[n])
                    # The fabric times its job itself, leaving out its CPU bookkeeping.
                    own_s = system.job_s if isinstance(system, Vramfabric) else None
                    elapsed_s = time.perf_counter() - t0 if own_s is None else own_s
                    times.setdefault((system.name, n), []).append(elapsed_s)
                    assert best == expected[n], f"{system.name}: argmin {best}, not {expected[n]}"
    return times


def summary(
    times: dict[tuple[str, int], list[float]], fabric: Vramfabric, sizes: list[int]
) -> list[dict[str, Any]]:
    """One line per system and size, then the fabric's ratios per size."""
    stamp = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "load_1m": round(os.getloadavg()[0], 2),
        "date": time.strftime("%Y-%m-%d"),
    }
    lines: list[dict[str, Any]] = []
    for (name, n), samples in times.items():
        ordered = sorted(samples)
        line: dict[str, Any] = {"bench": "batched", "system": name, "n": n}
        line["median_s"] = round(statistics.median(ordered), 4)
        line["p90_s"] = round(ordered[math.ceil(0.9 * len(ordered)) - 1], 4)
        line["samples"] = len(ordered)
        if name == fabric.name:
            line["cpu_us_per_chunk"] = fabric.cpu_us_per_chunk(n)
            line["processes_exited"] = fabric.exited
            line["coordinator_idle_cpu_share"] = round(fabric.idle_cpu_share, 3)
        lines.append({**line, **stamp})
    for n in sizes:
        median = {name: statistics.median(s) for (name, m), s in times.items() if m == n}
        vf = median["vramfabric"]
        ratios: dict[str, Any] = {"of_pool": round(vf / median["pool"], 3)}
        for peer in ("ray", "dask"):
            best = min((s for name, s in median.items() if name.startswith(peer)), default=None)
            if best is not None:
                ratios[f"of_best_{peer}"] = round(vf / best, 3)
        ratios["of_jetstream"] = round(vf / median["jetstream"], 3)
        ratios["within_2x_of_pool"] = vf <= 2 * median["pool"]
        if "of_best_ray" in ratios:
            ratios["faster_than_best_ray"] = ratios["of_best_ray"] < 1
        lines.append(
            {"bench": "batched", "system": "vramfabric", "n": n, "ratios": ratios, **stamp}
        )
    return lines


def importable(name: str) -> bool:
    """Whether `name` imports; prints a note line where it does not."""
    try:
        __import__(name)
    except ImportError:
        note = f"{name} not installed: left out (pip install ray dask distributed)"
        print(json.dumps({"bench": "batched", "note": note}), flush=True)
        return False
    return True


def main() -> None:
    """Parse arguments, run, print the JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append", help="configurations a job (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=3, help="jobs per system, size and round")
    parser.add_argument("--no-ray", dest="ray", action="store_false", help="leave Ray out")
    parser.add_argument("--no-dask", dest="dask", action="store_false", help="leave Dask out")
    args = parser.parse_args()
    args.n = args.n or [10_000, 100_000]
    args.ray = args.ray and importable("ray")
    args.dask = args.dask and importable("distributed")
    # Forked first, before this process has a thread or a child.
    pool = mp.get_context("fork").Pool(WORKERS)
    try:
        for line in asyncio.run(bench(args, pool)):
            print(json.dumps(line), flush=True)
    finally:
        pool.terminate()
        pool.join()


if __name__ == "__main__":
    main()
