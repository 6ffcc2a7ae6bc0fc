"""500 tenants: server start, lease latency, and 50 tenants added one by one under a running job.

The operator's path with auth on: a tenants file of `--tenants` students (each an account
of its own, its streams provisioned), the server run from it (`AuthServer`, as `vramfabric
server --tenants FILE` runs it), two simulated workers reading its policy file. It measures,
beside the same with one tenant in the same run: the server's start with every account
provisioned; and over `--probes` students spread through the file, entering `fabric.gpu()`
(one lease) and a first call. Then one tenant runs a job of `--chunks` chunks while
`--add` tenants are appended to the file and applied one at a time (each a server restart:
nats-server#8560); the job must end with every chunk folded once, and the last tenant added
must lease and run a call. One JSON line per measurement.

    python bench/many_tenants.py [--tenants 500] [--add 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from vramfabric.authserver import AuthServer
from vramfabric.broker import BrokerSettings, auth, tenants
from vramfabric.coordinator import CoordinatorSettings, Fabric, Job, JobResult, Mean
from vramfabric.local import LocalFleet, demo_tenants_file


def nothing(x: int) -> int:
    """A trivial call: the lease and the call path are what is timed."""
    return x


def chunk(x: int) -> float:
    """One chunk of the running job: a short wait, then its own number."""
    time.sleep(0.1)  # stands in for the chunk's GPU work
    return float(x)


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1e3, 1),
        "p90_ms": round(ordered[max(0, int(len(ordered) * 0.9) - 1)] * 1e3, 1),
        "max_ms": round(ordered[-1] * 1e3, 1),
    }


def _started(path: Path) -> tuple[AuthServer, float]:
    """The server run from `path`, and how long its start and provisioning took."""
    operator = tenants.load(path).operator.password or ""
    t0 = time.perf_counter()
    server = AuthServer(path, BrokerSettings(), operator).start()
    return server, time.perf_counter() - t0


async def _probe(broker: BrokerSettings, name: str) -> float:
    """Seconds from connecting as `name` to a first call's result on a leased slice."""
    settings = CoordinatorSettings(tenant=name, slice_bytes=2**30)
    t0 = time.perf_counter()
    async with await Fabric.connect(broker, settings) as fabric, fabric.gpu() as gpu:
        assert await gpu.run(nothing, 7) == 7
        return time.perf_counter() - t0


def _add_tenants(
    server: AuthServer, fleet: LocalFleet, path: Path, names: list[str], took: list[float]
) -> None:
    """Append each tenant to the file and apply it (the server restarts), one at a time."""
    for name in names:
        with path.open("a") as f:
            f.write(
                f'\n[tenants.{name}]\npassword = "{secrets.token_hex(16)}"\nallow_code = true\n'
            )
        t0 = time.perf_counter()
        server.reload()
        # The workers read the policy file the fleet gave them: give them the new one.
        tenants.write_policy(tenants.load(path).policy, fleet.policy_file)
        took.append(time.perf_counter() - t0)


async def _run_job(fleet: LocalFleet, owner: str, n: int) -> tuple[JobResult, float]:
    """Run the job of `n` chunks as `owner`; its result, and when (monotonic) it ended."""
    settings = CoordinatorSettings(tenant=owner, slice_bytes=2**30)
    async with await Fabric.connect(fleet.broker_for(owner), settings) as fabric:
        job = Job(chunk, list(range(n)), job_id=f"many{secrets.token_hex(4)}")
        result = await fabric.run(job, Mean(), timeout_s=1800)
        return result, time.monotonic()


def _job_under_changes(
    server: AuthServer, fleet: LocalFleet, path: Path, args: argparse.Namespace
) -> dict[str, Any]:
    added = [f"late{i:03d}" for i in range(args.add)]
    took: list[float] = []
    outcome: list[tuple[JobResult, float]] = []
    # The job runs in a thread of its own; tenants are added from this (main) thread: a
    # server restarted from a thread that then ends would die with it (die_with_parent).
    job = threading.Thread(
        target=lambda: outcome.append(asyncio.run(_run_job(fleet, "student000", args.chunks)))
    )
    job.start()
    _add_tenants(server, fleet, path, added, took)
    last_added_at = time.monotonic()
    job.join()
    if not outcome:
        raise RuntimeError("the job raised (see above)")
    result, ended_at = outcome[0]
    last = 0.0
    if added:
        password = tenants.load(path).tenant(added[-1]).credential.password or ""
        last = asyncio.run(_probe(auth.settings_for(fleet.broker, added[-1], password), added[-1]))
    expected = sum(range(args.chunks)) / args.chunks
    return {
        "bench": "many_tenants",
        "measure": "tenants_added_under_a_job",
        "added": len(added),
        "job_still_running_when_the_last_was_added": ended_at > last_added_at,
        "reload": _ms(took) if took else None,
        "chunks": args.chunks,
        "n_ok": result.n_ok,
        "lost": args.chunks - result.n_ok,
        "value_right": abs(result.value - expected) < 1e-9,
        "last_added_first_call_ms": round(last * 1e3, 1),
    }


def main() -> int:
    """Measure; print one JSON line per measurement."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tenants", type=int, default=500)
    p.add_argument("--probes", type=int, default=20)
    p.add_argument("--add", type=int, default=50)
    p.add_argument("--chunks", type=int, default=16000)
    args = p.parse_args()
    if args.tenants < 1 or args.probes < 1 or args.add < 0 or args.chunks < 1:
        p.error("--tenants, --probes and --chunks must be 1 or more, --add 0 or more")
    common = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for count in (1, args.tenants):
            names = tuple(f"student{i:03d}" for i in range(count))
            path = demo_tenants_file(Path(tmp) / f"tenants{count}.toml", names, allow_code=True)
            server, start_s = _started(path)
            try:
                fleet = LocalFleet(
                    workers=2,
                    simulate="1x4GiB",
                    slice_size="1GiB",
                    url=server.server.url,
                    tenants_file=str(path),
                    worker_args=("--allow-code",),
                )
                with fleet:
                    step = max(1, count // args.probes)
                    probes = [
                        asyncio.run(_probe(fleet.broker_for(names[i]), names[i]))
                        for i in range(0, count, step)
                    ]
                    line = {
                        "bench": "many_tenants",
                        "measure": "start_and_first_call",
                        "tenants": count,
                        "server_start_s": round(start_s, 2),
                        "entry_to_first_result": _ms(probes),
                        "probes": len(probes),
                    }
                    print(json.dumps({**line, **common}), flush=True)
                    if count == args.tenants:
                        changed = _job_under_changes(server, fleet, path, args)
                        print(json.dumps({**changed, **common}), flush=True)
            finally:
                server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
