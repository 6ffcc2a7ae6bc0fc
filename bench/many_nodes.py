"""Leases from many nodes: 10,000 leases from 256 simulated nodes; one JSON line.

An embedded nats-server and one worker process running `--nodes 256` simulated nodes of
one 80 GiB GPU each (512 MiB slices: 160 per node), side by side (worker/colocated.py). A
job's spec and consumer are made as `Fabric.run` makes them, so each node starts the job's
puller as it would. Then `--runs` times: one pool acquires `--leases` leases (default
placement: spread) and releases them; the medians are reported, with how many nodes
granted, the worker's time to ready and its resident memory.

    python bench/many_nodes.py                   # 256 nodes, 10,000 leases, 5 runs
    python bench/many_nodes.py --nodes 64 --leases 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from vramfabric.broker import BrokerSettings, topology
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.server import NatsServer
from vramfabric.coordinator import CoordinatorSettings, Fabric
from vramfabric.coordinator.jobs.publish import publish_spec
from vramfabric.coordinator.leases.leasing import LeasePool

SLICE_BYTES = 512 * 2**20


def rss_mb(pid: int) -> float:
    """Resident memory of a process, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def measure(url: str, nodes: int, leases: int, runs: int) -> dict[str, object]:
    """Start the nodes, then acquire and release `leases` leases `runs` times."""
    env = dict(os.environ, VRAMFABRIC_NATS_URL=url)
    cmd = [sys.executable, "-m", "vramfabric.worker", "--simulate", "1x80GiB", "--node", "sim"]
    t = time.perf_counter()
    worker = subprocess.Popen([*cmd, "--nodes", str(nodes)], env=env, stdout=subprocess.PIPE)
    try:
        assert worker.stdout is not None
        ready_line = worker.stdout.readline().decode()
        ready_s = time.perf_counter() - t
        if not ready_line.startswith("worker ready"):
            raise SystemExit(f"worker did not start: {ready_line!r}")
        broker = BrokerSettings(url=url)
        settings = CoordinatorSettings(slice_bytes=SLICE_BYTES, lease_ttl_s=60.0)
        fabric = await Fabric.connect(broker, settings)
        try:
            while len(fabric.fleet.adverts) < nodes:
                await asyncio.sleep(0.05)  # poll: every node's first advert
            spec = JobSpec(
                tenant="default",
                kernel="hyperparam_eval",
                kernel_digest="",
                n_chunks=1,
                job_id="wide",
            )
            await topology.ensure_tenant(fabric.conn.js, broker, "default")
            await publish_spec(fabric.conn, broker, spec)
            await topology.ensure_job_consumer(fabric.conn.js, broker, spec)
            acquire_s, release_s, granting = [], [], []
            for _ in range(runs):
                pool = LeasePool(fabric.conn, broker, settings, fabric.fleet, "wide")
                t = time.perf_counter()
                got = await pool.acquire(leases)
                acquire_s.append(time.perf_counter() - t)
                if got != leases:
                    raise SystemExit(f"acquired {got} of {leases}")
                granting.append(len({lease.node for lease in pool.leases.values()}))
                t = time.perf_counter()
                await pool.release()
                release_s.append(time.perf_counter() - t)
                while fabric.fleet.free_slices(SLICE_BYTES) < nodes * 160:
                    await asyncio.sleep(0.05)  # poll: the adverts show the VRAM back
            worker_rss = rss_mb(worker.pid)
        finally:
            await fabric.close()
    finally:
        worker.terminate()
        worker.wait(60)
    return {
        "bench": "many_nodes",
        "nodes": nodes,
        "leases": leases,
        "runs": runs,
        "acquire_s": round(statistics.median(acquire_s), 3),
        "release_s": round(statistics.median(release_s), 3),
        "nodes_granting": min(granting),
        "worker_ready_s": round(ready_s, 2),
        "worker_rss_mb": round(worker_rss, 1),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with NatsServer() as server:
        print(json.dumps(asyncio.run(measure(server.url, args.nodes, args.leases, args.runs))))
