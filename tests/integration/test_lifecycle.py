"""`vramfabric up`, a client that finds it with no settings, and the job lifecycle commands.

Everything runs as a user would: `up`, the client script and every command are
subprocesses sharing only a temporary HOME and XDG_RUNTIME_DIR, with no VRAMFABRIC_* in
their environment. What `rm` leaves behind is checked with nats-py against the server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest

from tests.helpers import eventually, interrupt, poll_until, wait_for_line
from tests.integration.conftest import AgentFactory, FabricFactory
from tests.kernels_for_tests import SLEEPY, sleepy_input
from vramfabric.broker import BrokerSettings
from vramfabric.broker.errors import JobNotFound, JobTimeout
from vramfabric.broker.messages import JobSpec
from vramfabric.coordinator import ArgMin, Job, JobResult
from vramfabric.coordinator.jobs import joblist, lifecycle
from vramfabric.coordinator.jobs.stored import finished_chunks
from vramfabric.demo import reference_argmin
from vramfabric.kernels.hyperparam import search_space

CLI = [sys.executable, "-m", "vramfabric"]
N_CONFIGS = 20

QUICK_JOB = f"""
import asyncio, json
from vramfabric.coordinator import ArgMin, Fabric, Job
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space

async def main():
    async with await Fabric.connect() as fabric:
        job = Job(HYPERPARAM_EVAL, [encode_config(*c) for c in search_space({N_CONFIGS})])
        result = await fabric.run(job, ArgMin())
        print(json.dumps({{"job_id": result.job_id, "ok": result.n_ok, "value": result.value}}))

asyncio.run(main())
"""

LONG_JOB = """
import asyncio, json
from vramfabric.broker.errors import JobCancelled
from vramfabric.coordinator import Fabric, Gather, Job

def nap(x):
    import time
    time.sleep(2)  # stands in for a chunk of real work
    return x

async def main():
    async with await Fabric.connect() as fabric:
        try:
            await fabric.run(Job(nap, list(range(120))), Gather())
        except JobCancelled as exc:
            print(json.dumps({"cancelled": str(exc)}), flush=True)
            return
        print(json.dumps({"cancelled": None}))

asyncio.run(main())
"""


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    """An environment with no VRAMFABRIC_* settings and a private HOME and runtime dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VRAMFABRIC_", "XDG_"))}
    (tmp_path / "home").mkdir()
    (tmp_path / "run").mkdir(mode=0o700)
    env.update(HOME=str(tmp_path / "home"), XDG_RUNTIME_DIR=str(tmp_path / "run"))
    return env


@pytest.fixture
def fabric_up(user_env: dict[str, str]) -> Iterator[str]:
    """`vramfabric up` running (one worker of 1x4GiB in 512MiB slices); yields its URL."""
    proc = subprocess.Popen(
        [*CLI, "up", "--workers", "1", "--simulate", "1x4GiB", "--allow-code"],
        env=user_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    discovery = Path(user_env["XDG_RUNTIME_DIR"]) / "vramfabric" / "fabric.json"
    try:
        line = wait_for_line(proc.stdout, "vramfabric up:", timeout_s=60)
        url = line.split()[2]
        assert json.loads(discovery.read_text()) == {"url": url, "pid": proc.pid}
        yield url
    finally:
        code = interrupt(proc)
    # Then Ctrl-C stops it cleanly and takes the discovery file away
    assert code == 0
    assert not discovery.exists()


def cli(env: dict[str, str], *args: str, expect: int = 0) -> Any:
    """Run one `vramfabric ... --json` command; check its exit code; return its JSON."""
    proc = subprocess.run(
        [*CLI, *args, "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == expect, proc.stderr[-3000:]
    return json.loads(proc.stdout) if expect == 0 else None


def script(tmp_path: Path, name: str, source: str) -> list[str]:
    """A client script file, as a command line."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return [sys.executable, str(path)]


async def gone_from_server(url: str, job: str) -> None:
    """Assert through the JetStream API that nothing of `job` is left on the server."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        results = await js.stream_info(
            "VF_RESULTS_default", subjects_filter=f"vf.result.default.{job}.>"
        )
        assert not results.state.subjects
        work = await js.stream_info("VF_WORK_default", subjects_filter=f"vf.work.default.{job}")
        assert not work.state.subjects
        kv = await js.stream_info("KV_vf_jobs", subjects_filter=f"$KV.vf_jobs.default.{job}.>")
        assert not kv.state.subjects
        kv = await js.stream_info("KV_vf_jobs", subjects_filter=f"$KV.vf_jobs.default.{job}")
        assert not kv.state.subjects
        jobs = await js.key_value("vf_jobs")
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await jobs.get(f"default.{job}")
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.consumer_info("VF_WORK_default", f"vf_job_{job}")
    finally:
        await nc.close()


async def test_up_connect_jobs_job_cancel_rm(
    fabric_up: str, user_env: dict[str, str], tmp_path: Path
) -> None:
    # Given `vramfabric up`, a client that only calls Fabric.connect() runs a job on it
    quick = subprocess.run(
        script(tmp_path, "quick.py", QUICK_JOB),
        env=user_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert quick.returncode == 0, quick.stderr[-3000:]
    ran = json.loads(quick.stdout)
    best, _ = reference_argmin(search_space(N_CONFIGS))
    assert ran["ok"] == N_CONFIGS and ran["value"][0] == best
    job = ran["job_id"]

    # When the user lists the jobs and inspects that one
    listed = {j["job"]: j for j in cli(user_env, "jobs")}
    shown = cli(user_env, "job", job)

    # Then both show it done, with every chunk, and its stored aggregate
    assert listed[job]["state"] == "done" and listed[job]["kernel"] == "hyperparam_eval"
    assert (listed[job]["n_done"], listed[job]["n_failed"], listed[job]["n_chunks"]) == (
        N_CONFIGS,
        0,
        N_CONFIGS,
    )
    assert listed[job]["age_s"] >= 0
    assert shown["n_ok"] == N_CONFIGS and shown["failures_by_kind"] == {}
    assert shown["value"] == ran["value"]

    # Given a long job (120 chunks of 2 s on 8 slices) that is running and holds leases
    long_run = subprocess.Popen(
        script(tmp_path, "long.py", LONG_JOB),
        env=user_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        long_job = await running_job_with_leases(user_env, exclude=job)

        # When the user cancels it
        assert cli(user_env, "cancel", long_job) == {"job": long_job, "cancelled": True}

        # Then the client's run ends as cancelled, its leases are released, the
        # consumer is gone and the chunks not yet run stay unrun
        out, errs = long_run.communicate(timeout=60)
        assert long_run.returncode == 0, errs[-3000:]
        assert "cancelled" in json.loads(out)["cancelled"]
        assert poll_until(lambda: no_leases(user_env), timeout_s=20)
        cancelled = cli(user_env, "job", long_job)
        assert cancelled["state"] == "cancelled"
        assert cancelled["n_done"] < cancelled["n_chunks"] == 120
        assert cli(user_env, "cancel", long_job) == {"job": long_job, "cancelled": False}
    finally:
        if long_run.poll() is None:
            long_run.kill()
            long_run.communicate()

    # When the user removes both jobs
    for removed in (job, long_job):
        assert cli(user_env, "rm", removed) == {"job": removed, "removed": True}
        # Then nothing of the job is left: results, chunks, spec, record, consumer
        await gone_from_server(fabric_up, removed)
        cli(user_env, "job", removed, expect=5)
    assert cli(user_env, "jobs") == []
    cli(user_env, "cancel", job, expect=5)


def test_a_second_up_refuses_and_leaves_the_first_findable(
    fabric_up: str, user_env: dict[str, str]
) -> None:
    # Given `vramfabric up` running for this user
    discovery = Path(user_env["XDG_RUNTIME_DIR"]) / "vramfabric" / "fabric.json"
    before = discovery.read_text()
    # When the user starts a second one
    second = subprocess.run(
        [*CLI, "up", "--workers", "1", "--simulate", "1x4GiB"],
        env={**user_env, "COLUMNS": "1000"},  # one line per message: no console wrapping
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Then it refuses, naming the live fabric's URL and the discovery file
    said = second.stderr
    assert second.returncode == 1, second.stderr[-3000:]
    assert fabric_up in said and str(discovery) in said
    assert "Traceback" not in said
    # And the first is untouched: its discovery file is the same and clients still find it
    assert discovery.read_text() == before
    assert cli(user_env, "status")["nodes"]


async def running_job_with_leases(env: dict[str, str], exclude: str) -> str:
    """Poll `jobs` and `status` until another job runs and holds leases; return its id."""
    found: list[str] = []

    def check() -> bool:
        running = [j["job"] for j in cli(env, "jobs") if j["state"] == "running"]
        held = cli(env, "status")["leases_by_job"]
        found[:] = [j for j in running if j != exclude and held.get(f"default.{j}", 0) > 0]
        return bool(found)

    await eventually(check, timeout_s=60, interval_s=0.5)
    return found[0]


def no_leases(env: dict[str, str]) -> bool:
    """Whether the fleet holds no lease and no leased VRAM."""
    status = cli(env, "status")
    return bool(status["leases"] == 0 and status["leased_bytes"] == 0 and status["n_nodes"] == 1)


async def test_a_timed_out_run_deletes_its_consumer_and_records_the_timeout(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, broker: BrokerSettings
) -> None:
    # Given a node and a job of slow chunks on one slice
    await agent_factory("n1")
    fabric = await fabric_factory()
    job = Job(SLEEPY, [sleepy_input(i) for i in range(10)], args={"sleep_s": 1.0})
    job_id = job.spec(fabric.settings).job_id
    # When the run times out
    with pytest.raises(JobTimeout):
        await fabric.run(job, ArgMin(), slices=1, timeout_s=0.5)
    # Then its consumer is gone, and the job shows as timed out with chunks left to do
    s = broker.subjects
    with pytest.raises(nats.js.errors.NotFoundError):
        await fabric.conn.js.consumer_info(s.work_stream("default"), s.job_consumer(job_id))
    info = await joblist.inspect(fabric.conn, broker, "default", job_id)
    assert info.state == "timeout" and info.n_done < 10


async def test_retention_removes_jobs_finished_before_the_cutoff(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, broker: BrokerSettings
) -> None:
    # Given a finished job
    await agent_factory("n1")
    fabric = await fabric_factory()
    first = await fabric.run(Job(SLEEPY, [sleepy_input(i) for i in range(3)]), ArgMin())
    conn = fabric.conn
    # Then a sweep keeps it while it is younger than the retention
    assert await lifecycle.sweep(conn, broker, "default", 3600.0, time.time()) == []
    assert (await joblist.inspect(conn, broker, "default", first.job_id)).state == "done"
    # When a coordinator with a retention runs another job after it
    keeper = await fabric_factory(job_retention_s=1e-3)
    await keeper.run(Job(SLEEPY, [sleepy_input(i) for i in range(4)]), ArgMin())
    # Then the older job is gone, spec and results alike
    with pytest.raises(JobNotFound):
        await joblist.inspect(conn, broker, "default", first.job_id)
    assert await finished_chunks(conn, broker, spec_naming(first)) == set()


def spec_naming(result: JobResult) -> JobSpec:
    """A spec naming the result's job, enough to query its results subjects."""
    return JobSpec(
        tenant="default", kernel="sleepy", kernel_digest="", n_chunks=3, job_id=result.job_id
    )
