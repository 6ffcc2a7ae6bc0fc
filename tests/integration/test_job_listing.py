"""`jobs` at scale: a page of 100,000 finished jobs from their records; `rm` of a bad key."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from vramfabric.broker import BrokerSettings, buckets
from vramfabric.broker.codec import encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.messages import JobRecord
from vramfabric.coordinator.jobs import joblist

N_JOBS = 100_000


async def store_finished_jobs(conn: Connection, broker: BrokerSettings, n: int) -> None:
    """Write `n` finished jobs' run records as their coordinators would, oldest first."""
    await buckets.jobs_bucket(conn.js, broker)
    s, now = broker.subjects, time.time()
    for i in range(n):
        rec = JobRecord(
            job=f"job{i:06d}",
            kernel="hyperparam_eval",
            state="done",
            started_at=now - n + i,
            finished_at=now - n + i + 0.5,
            n_ok=10,
            n_chunks=10,
        )
        await conn.nc.publish(s.job_record("default", rec.job), encode(rec))
    await conn.nc.flush()
    stream = s.kv_stream(s.jobs_bucket())
    while (await conn.js.stream_info(stream)).state.messages < n:
        await asyncio.sleep(0.05)  # poll: the server stores the burst


def cli(broker: BrokerSettings, *args: str) -> subprocess.CompletedProcess[str]:
    """Run one `vramfabric` command against the test's server and prefix."""
    env = dict(os.environ, VRAMFABRIC_NATS_URL=broker.url, VRAMFABRIC_PREFIX=broker.prefix)
    return subprocess.run(
        [sys.executable, "-m", "vramfabric", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_jobs_lists_a_page_of_100000_finished_jobs_from_their_records(
    conn: Connection, broker: BrokerSettings
) -> None:
    # Given 100,000 finished jobs
    await store_finished_jobs(conn, broker, N_JOBS)
    # When the user lists them with the default page, and with a page of 3
    shown = await asyncio.to_thread(cli, broker, "jobs", "--json")
    three = await asyncio.to_thread(cli, broker, "jobs", "--limit", "3")
    # Then the newest page comes back, each job done with its counts, and says what is left
    assert shown.returncode == 0, shown.stderr[-2000:]
    listed: list[dict[str, Any]] = json.loads(shown.stdout)
    expected = [f"job{i:06d}" for i in range(N_JOBS - joblist.DEFAULT_PAGE, N_JOBS)]
    assert [j["job"] for j in listed] == expected
    assert {(j["state"], j["n_done"], j["n_failed"], j["n_chunks"]) for j in listed} == {
        ("done", 10, 0, 10)
    }
    assert f"of {N_JOBS}" in shown.stderr
    assert three.returncode == 0
    lines = three.stdout.splitlines()
    assert lines[0].split()[0] == "JOB" and [line.split()[0] for line in lines[1:]] == [
        "job099997",
        "job099998",
        "job099999",
    ]
    # And every job is there for the one who asks for all
    page = await joblist.list_jobs(conn, broker, "default", None)
    assert page.total == N_JOBS and len(page.jobs) == N_JOBS


async def test_a_job_whose_spec_and_record_do_not_decode_is_listed_and_removed(
    conn: Connection, broker: BrokerSettings
) -> None:
    # Given a job whose spec and run record are garbage
    await buckets.jobs_bucket(conn.js, broker)
    s = broker.subjects
    await conn.js.publish(s.job_spec("default", "broken"), b"\xc1 not msgpack")
    await conn.js.publish(s.job_record("default", "broken"), b"\xc1 not msgpack")
    # When the user lists the jobs
    shown = await asyncio.to_thread(cli, broker, "jobs", "--json")
    # Then it is listed as unreadable, not hidden
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert [(j["job"], j["state"]) for j in json.loads(shown.stdout)] == [("broken", "unreadable")]
    # When the user removes it
    removed = await asyncio.to_thread(cli, broker, "rm", "broken")
    # Then it is gone: removed, no longer listed, and not found
    assert removed.returncode == 0, removed.stderr[-2000:]
    assert removed.stdout.strip() == "job broken removed"
    assert json.loads((await asyncio.to_thread(cli, broker, "jobs", "--json")).stdout) == []
    assert (await asyncio.to_thread(cli, broker, "job", "broken")).returncode == 5


async def test_a_fresh_fabric_says_no_job_for_every_job_command(broker: BrokerSettings) -> None:
    # Given a fabric where no job was ever stored (no jobs bucket yet)
    for command in ("job", "cancel", "rm"):
        # When the user names a job
        done = await asyncio.to_thread(cli, broker, command, "nope")
        # Then the command says there is no such job, exit 5 (not a connection error)
        assert done.returncode == 5, done.stderr[-2000:]
        assert done.stderr.strip() == "vramfabric: no job 'nope' for tenant 'default'"
    listed = await asyncio.to_thread(cli, broker, "jobs")
    assert (listed.returncode, listed.stdout.strip()) == (0, "no jobs")
