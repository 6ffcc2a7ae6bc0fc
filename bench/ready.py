"""Ready benchmark (issue 17): how soon a local fabric serves, and runs its first chunk.

Two ways to start one, each timed from the moment it is asked for:

- `up`: `vramfabric up` as a subprocess (its own interpreter and imports included), until it
  prints its ready line, then until a first job of one chunk (the built-in hyperparam_eval,
  through `Fabric.run` from this process: spec, lease, submit, execute, result, release) is
  done;
- `fleet`: `LocalFleet().start()` in this process, until it returns, then the same job;
- `worker`: one worker process (`python -m vramfabric.worker`, the same GPUs) against a
  server already up, until it says ready: the part of the above that is one interpreter
  starting and importing the agent.

After that first job a second one runs on the now-warm fabric: the difference is what the
first chunk pays for arriving at a worker whose executors are still starting. This process
imports the client side before any clock starts (a client's imports are not the fabric's).

    python bench/ready.py                 # 5 runs of each, medians; 2 workers of 4x80GiB
    python bench/ready.py --runs 3 --workers 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import CoordinatorSettings, Fabric, Job
from vramfabric.coordinator.aggregate import ArgMin
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space
from vramfabric.local import LocalFleet

READY_PREFIX = b"vramfabric up: "


async def one_chunk_job(broker: BrokerSettings, run: str) -> float:
    """Run a job of one chunk; return its seconds (connect included)."""
    t0 = time.perf_counter()
    settings = CoordinatorSettings(max_slices=1)
    async with await Fabric.connect(broker, settings) as fabric:
        job = Job(HYPERPARAM_EVAL, [encode_config(*search_space(1)[0])], job_id=run)
        result = await fabric.run(job, ArgMin(), slices=1, timeout_s=60)
    assert result.n_ok == 1, result.failures
    return time.perf_counter() - t0


def jobs_after(t0: float, broker: BrokerSettings, run: str) -> dict[str, float]:
    """The first job's end (from `t0`) and length, and a second job's length."""
    first_s = asyncio.run(one_chunk_job(broker, f"{run}a"))
    first_done_s = time.perf_counter() - t0
    second_s = asyncio.run(one_chunk_job(broker, f"{run}b"))
    return {"first_chunk_s": first_done_s, "first_job_s": first_s, "warm_job_s": second_s}


def run_up(workers: int, simulate: str, run: str) -> dict[str, float]:
    """Time `vramfabric up` to its ready line and to its first job done."""
    with tempfile.TemporaryDirectory(prefix="vf-ready-") as runtime:
        env = dict(os.environ, XDG_RUNTIME_DIR=runtime)
        cmd = [sys.executable, "-m", "vramfabric", "up", "--workers", str(workers)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [*cmd, "--simulate", simulate], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            ready_s = time.perf_counter() - t0
            if not line.startswith(READY_PREFIX):
                raise RuntimeError(f"vramfabric up did not start: {line!r}")
            url = line[len(READY_PREFIX) :].split()[0].decode()
            return {"ready_s": ready_s, **jobs_after(t0, BrokerSettings(url=url), run)}
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=30)


def run_fleet(workers: int, simulate: str, run: str) -> dict[str, float]:
    """Time `LocalFleet().start()` and its first job done."""
    t0 = time.perf_counter()
    fleet = LocalFleet(workers=workers, simulate=simulate).start()
    try:
        ready_s = time.perf_counter() - t0
        return {"ready_s": ready_s, **jobs_after(t0, fleet.broker, run)}
    finally:
        fleet.stop()


def run_worker(simulate: str) -> dict[str, float]:
    """Time one worker process, its server already up, to its ready line."""
    fleet = LocalFleet(workers=0, simulate=simulate).start()
    try:
        t0 = time.perf_counter()
        fleet.add_worker("alone")
        return {"ready_s": time.perf_counter() - t0}
    finally:
        fleet.stop()


def medians(samples: list[dict[str, float]]) -> dict[str, float]:
    """Median of each figure over the runs."""
    return {k: round(statistics.median(s[k] for s in samples), 3) for k in samples[0]}


def main() -> None:
    """Alternate the two ways `--runs` times; print one JSON line of medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--simulate", default="4x80GiB")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    samples: dict[str, list[dict[str, float]]] = {"up": [], "fleet": [], "worker": []}
    for _run in range(args.runs):
        tag = f"ready{time.time_ns()}"
        samples["up"].append(run_up(args.workers, args.simulate, f"{tag}u"))
        samples["fleet"].append(run_fleet(args.workers, args.simulate, f"{tag}f"))
        samples["worker"].append(run_worker(args.simulate))
    out: dict[str, Any] = {
        "bench": "ready",
        "workers": args.workers,
        "simulate": args.simulate,
        "runs": args.runs,
        **{way: medians(s) for way, s in samples.items()},
        "ready_s_all": {way: [round(x["ready_s"], 3) for x in s] for way, s in samples.items()},
        "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
