"""Lease flood: a tenant's lease requests and job while another floods the lease service.

One embedded fabric with auth on, two worker processes and two tenants: `alpha` leases and
releases a slice on each node in turn (a request-reply each, timed) and runs a job, first
in a quiet fabric, then while `beta` (a process of its own, tests/lease_flood.py, logged in
with its own password) keeps 600 renewals in flight over both nodes: batches of the most
ids a request may carry (250), then garbage of 200 KiB each (refused unread). One JSON line.

    python bench/lease_flood.py                  # 100 lease rounds, a 400-chunk job per phase
    python bench/lease_flood.py --rounds 200 --n 1000

Run it from the repository root (it starts the flood from tests/).
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
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, os.getcwd())

import nats.errors

from tests import lease_flood
from vramfabric.broker.codec import decode, encode
from vramfabric.broker.messages import (
    MAX_LEASE_IDS,
    LeaseGrant,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
)
from vramfabric.coordinator import ArgMin, CoordinatorSettings, Fabric, Job
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space
from vramfabric.local import LocalFleet, demo_tenants_file

ALPHA, BETA = "alpha", "beta"
GIB = 2**30
IN_FLIGHT = 600
# (phase, ids per renewal, garbage bytes per request)
PHASES = (
    ("quiet", 0, 0),
    ("renew_flood", MAX_LEASE_IDS, 0),
    ("oversized_flood", 0, 200 * 1024),
)


async def lease_rounds(fabric: Fabric, nodes: list[str], rounds: int) -> dict[str, Any]:
    """Lease and release one slice `rounds` times, nodes in turn; request times in seconds."""
    took: list[float] = []
    lost = 0
    s = fabric.broker.subjects
    for n in range(rounds):
        node = nodes[n % len(nodes)]
        req = LeaseRequest(f"b{uuid.uuid4().hex[:10]}", "bench", 1, GIB, 30.0)
        try:
            t0 = time.monotonic()
            msg = await fabric.conn.nc.request(s.lease(ALPHA, node, "acquire"), encode(req), 10)
            took.append(time.monotonic() - t0)
            grant = decode(LeaseGrant, msg.data)
            ids = tuple(x.lease_id for x in grant.leases)
            t0 = time.monotonic()
            msg = await fabric.conn.nc.request(
                s.lease(ALPHA, node, "release"), encode(ReleaseRequest(ids)), 10
            )
            took.append(time.monotonic() - t0)
            decode(ReleaseReply, msg.data)
        except nats.errors.TimeoutError:
            lost += 1
    took.sort()
    return {
        "lease_requests": len(took) + lost,
        "lease_timeouts": lost,
        "lease_p50_s": round(statistics.median(took), 4) if took else None,
        "lease_p95_s": round(took[int(0.95 * (len(took) - 1))], 4) if took else None,
        "lease_max_s": round(took[-1], 4) if took else None,
    }


async def job_time(fabric: Fabric, n: int) -> float:
    """Run alpha's job of `n` hyperparameter configurations on up to 16 slices; seconds."""
    inputs = [encode_config(*c) for c in search_space(n)]
    t0 = time.monotonic()
    job = Job(HYPERPARAM_EVAL, inputs, job_id=f"lf{time.time_ns()}")
    result = await fabric.run(job, ArgMin(), slices=16, timeout_s=600)
    assert result.ok, result.failures[:3]
    return time.monotonic() - t0


async def phases(fleet: LocalFleet, rounds: int, n: int) -> dict[str, Any]:
    """Every phase in turn: its flood started first, alpha's measures, the flood's outcomes."""
    settings = CoordinatorSettings(tenant=ALPHA, slice_bytes=GIB)
    beta = fleet.broker_for(BETA)
    env = {
        **os.environ,
        "VRAMFABRIC_NATS_URL": beta.url,
        "VRAMFABRIC_PREFIX": beta.prefix,
        "VRAMFABRIC_NATS_USER": BETA,
        "VRAMFABRIC_NATS_PASSWORD": beta.password or "",
    }
    out: dict[str, Any] = {}
    async with await Fabric.connect(fleet.broker_for(ALPHA), settings) as fabric:
        while len(fabric.fleet.adverts) < len(fleet.procs):
            await fabric.fleet.wait_changed(timeout_s=1.0)
        nodes = sorted(fabric.fleet.adverts)
        await job_time(fabric, min(n, 64))  # warm: executors up, code and specs cached
        for name, ids, raw in PHASES:
            flood = None
            if ids or raw:
                flood = lease_flood.start(env, nodes, BETA, IN_FLIGHT, ids=ids, raw_bytes=raw)
                assert flood.stdout is not None
                assert lease_flood.STARTED in flood.stdout.readline()
                await asyncio.sleep(1.0)  # the flood at full rate before alpha measures
            try:
                line = await lease_rounds(fabric, nodes, rounds)
                line["job_s"] = round(await job_time(fabric, n), 3)
            finally:
                if flood is not None:
                    line["flood"] = lease_flood.stop(flood)
            out[name] = line
    return out


def main() -> int:
    """Parse flags, run the bench, print one JSON line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=100, help="lease+release rounds per phase")
    parser.add_argument("--n", type=int, default=400, help="chunks of alpha's job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = demo_tenants_file(Path(folder) / "tenants.toml", (ALPHA, BETA))
        fleet = LocalFleet(workers=2, simulate="2x8GiB", slice_size="1GiB", tenants_file=str(path))
        fleet.start()
        try:
            line: dict[str, Any] = asyncio.run(phases(fleet, args.rounds, args.n))
        finally:
            codes = fleet.stop()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    line.update(
        bench="lease_flood",
        in_flight=IN_FLIGHT,
        worker_exit_codes=codes,
        commit=commit,
        date=time.strftime("%Y-%m-%d"),
        machine=f"{platform.machine()} {os.cpu_count()} cores Python {platform.python_version()}",
    )
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
