"""Listing jobs at scale: `vramfabric jobs` over 100,000 finished jobs; one JSON line.

An embedded nats-server holds `--n` finished jobs' run records (written as coordinators
write them). Measured, each `--runs` times (medians reported): the `vramfabric jobs`
command as a user runs it (a new process: interpreter start, connect, one page of 100),
`joblist.list_jobs` for that page in-process, and for every job (`--all`).

    python bench/joblist.py                # 100,000 jobs, 5 runs
    python bench/joblist.py --n 10000 --runs 3
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

from vramfabric.broker import BrokerSettings, buckets
from vramfabric.broker.codec import encode
from vramfabric.broker.connection import Connection, connect
from vramfabric.broker.messages import JobRecord
from vramfabric.broker.server import NatsServer
from vramfabric.coordinator.jobs import joblist


async def store_records(conn: Connection, broker: BrokerSettings, n: int) -> None:
    """Write `n` finished jobs' run records, oldest first, and wait until all are stored."""
    await buckets.jobs_bucket(conn.js, broker)
    s, now = broker.subjects, time.time()
    for i in range(n):
        rec = JobRecord(
            job=f"job{i:06d}",
            kernel="hyperparam_eval",
            state="done",
            started_at=now - n + i,
            finished_at=now - n + i + 0.5,
            n_ok=1000,
            n_chunks=1000,
        )
        await conn.nc.publish(s.job_record("default", rec.job), encode(rec))
    await conn.nc.flush()
    stream = s.kv_stream(s.jobs_bucket())
    while (await conn.js.stream_info(stream)).state.messages < n:
        await asyncio.sleep(0.05)  # poll: the server stores the burst


def cli_jobs_s(broker: BrokerSettings) -> float:
    """Wall time of `vramfabric jobs` in a new process, output to a pipe."""
    env = dict(os.environ, VRAMFABRIC_NATS_URL=broker.url, VRAMFABRIC_PREFIX=broker.prefix)
    t = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "vramfabric", "jobs"], env=env, capture_output=True, timeout=120
    )
    elapsed = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(done.stderr.decode()[-2000:])
    return elapsed


async def timed_list(conn: Connection, broker: BrokerSettings, limit: int | None) -> float:
    """Seconds for one `list_jobs` call."""
    t = time.perf_counter()
    page = await joblist.list_jobs(conn, broker, "default", limit)
    elapsed = time.perf_counter() - t
    assert page.total >= len(page.jobs) > 0
    return elapsed


async def main(n: int, runs: int) -> dict[str, object]:
    """Store the records, then time each way of listing them `runs` times."""
    with NatsServer() as server:
        broker = BrokerSettings(url=server.url)
        conn = await connect(broker, name="bench-joblist")
        try:
            await store_records(conn, broker, n)
            cli_s = [await asyncio.to_thread(cli_jobs_s, broker) for _ in range(runs)]
            page_s = [await timed_list(conn, broker, joblist.DEFAULT_PAGE) for _ in range(runs)]
            all_s = [await timed_list(conn, broker, None) for _ in range(runs)]
        finally:
            await conn.close()
    return {
        "bench": "joblist",
        "jobs": n,
        "runs": runs,
        "cli_jobs_s": round(statistics.median(cli_s), 3),
        "page_of_100_s": round(statistics.median(page_s), 4),
        "all_jobs_s": round(statistics.median(all_s), 3),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="finished jobs stored")
    parser.add_argument("--runs", type=int, default=5, help="measurements of each kind")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.n, args.runs))))
