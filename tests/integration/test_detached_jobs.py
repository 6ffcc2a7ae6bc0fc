"""Jobs that outlive their terminal: `run --detach`, the driver's heartbeat, `Fabric.job(ID)`.

The detached coordinator is a real `vramfabric run` process; the workers are in-process
agents on the test's event loop, so every blocking wait on a process runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import alive, eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from tests.kernels_for_tests import SLEEPY, executions, sleepy_input
from vramfabric.broker import BrokerSettings, buckets
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import JobCancelled
from vramfabric.coordinator import ArgMax, Job
from vramfabric.coordinator.jobs import joblist
from vramfabric.coordinator.jobs.driver import ORPHANED

CLI = [sys.executable, "-m", "vramfabric"]
N_CHUNKS = 6
# What `aggregate = "argmax"` folds from the sleepy kernel's outputs (float32 of the input).
BEST = [N_CHUNKS - 1, float(N_CHUNKS - 1)]

RESULT_SCRIPT = """
import json, sys
import vramfabric

fabric = vramfabric.connect()
try:
    result = fabric.job(sys.argv[1]).result(timeout_s=float(sys.argv[2]))
    print(json.dumps({"value": result.value, "ok": result.n_ok, "failed": result.n_failed}))
finally:
    fabric.close()
"""


def job_file(tmp_path: Path, sleep_s: float, slices: int) -> tuple[Path, Path]:
    """A JOB.toml of N_CHUNKS sleepy chunks that log each execution; (file, log folder)."""
    inputs, runs = tmp_path / "inputs", tmp_path / "runs"
    inputs.mkdir()
    runs.mkdir()
    for i in range(N_CHUNKS):
        (inputs / f"{i:02d}.bin").write_bytes(struct.pack("<i", i))
    path = tmp_path / "job.toml"
    path.write_text(
        'kernel = "sleepy"\nkernel_modules = ["tests.kernels_for_tests"]\n'
        f'aggregate = "argmax"\nslices = {slices}\n'
        f'[args]\nsleep_s = {sleep_s}\nlog_dir = "{runs}"\n'
        '[inputs]\nglob = "inputs/*.bin"\n'
    )
    return path, runs


def user_env(broker: BrokerSettings, tmp_path: Path) -> dict[str, str]:
    """The CLI's environment: the test's server and prefix, short lease TTLs, its own state."""
    return dict(
        os.environ,
        VRAMFABRIC_NATS_URL=broker.url,
        VRAMFABRIC_PREFIX=broker.prefix,
        VRAMFABRIC_NODE_TTL_S=str(broker.node_ttl_s),
        VRAMFABRIC_LEASE_TTL_S="3",
        XDG_STATE_HOME=str(tmp_path / "state"),
        COLUMNS="1000",
    )


async def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run one `vramfabric` command (in a thread: the test's loop serves the workers)."""
    return await asyncio.to_thread(
        subprocess.run, [*CLI, *args], env=env, capture_output=True, text=True, timeout=120
    )


async def listed(env: dict[str, str], job: str) -> dict[str, Any]:
    """The job as `vramfabric jobs --json` lists it ({} while it is not listed yet)."""
    shown = await cli(env, "jobs", "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    return next((j for j in json.loads(shown.stdout) if j["job"] == job), {})


def run_on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[str, int, int]:
    """Run `argv` as the session leader of a new terminal, then hang the terminal up.

    Returns what it printed, its exit code and its pid. Once it exits, the kernel sends
    SIGHUP to the terminal's foreground process group; its process group is then killed
    too, as a closing terminal emulator's shell would leave it.
    """
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal is its controlling terminal
        os.execve(argv[0], argv, env)
    shown = b""
    try:
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the command exited and the terminal hung up
                break
            if not chunk:
                break
            shown += chunk
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    finally:
        os.close(fd)
    return shown.decode(errors="replace"), os.waitstatus_to_exitcode(status), pid


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_detached_run_survives_its_terminal_and_another_process_gets_its_result(
    agent_factory: AgentFactory, broker: BrokerSettings, tmp_path: Path
) -> None:
    # Given a node and a job file of 6 chunks of 2 s on 2 slices (about 6 s of work)
    await agent_factory("n-detach")
    path, runs = job_file(tmp_path, sleep_s=2.0, slices=2)
    env = user_env(broker, tmp_path)
    # When the user runs it detached on a terminal, and the terminal goes away
    argv = [*CLI, "run", str(path), "--detach", "--json"]
    shown, code, launcher = await asyncio.to_thread(run_on_a_terminal, argv, env)
    # Then the command returned at once with the job id, the coordinator's pid and its log
    assert code == 0, shown[-3000:]
    said = json.loads(shown.strip().splitlines()[-1])
    job, pid, log = said["job"], said["pid"], Path(said["log"])
    assert said["state"] == "running"
    assert log.parent == tmp_path / "state" / "vramfabric" / "jobs"
    # And the coordinator lives on in a session of its own, driving the job
    assert alive(pid) and os.getsid(pid) != launcher
    running: dict[str, Any] = {}

    async def is_running() -> bool:
        running.update(await listed(env, job))
        return running.get("state") == "running"

    await eventually(is_running, timeout_s=30, interval_s=0.2)
    assert running["coordinator"].startswith(f"pid {pid} ")
    assert running["log"] == str(log)
    # When another process asks for the job's result
    got = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", RESULT_SCRIPT, job, "90"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Then it gets the job's aggregate
    assert got.returncode == 0, got.stderr[-3000:]
    assert json.loads(got.stdout) == {"value": BEST, "ok": N_CHUNKS, "failed": 0}
    # And the detached coordinator finished the job itself, logged it, and exited
    await eventually(lambda: not alive(pid), timeout_s=30, interval_s=0.1)
    done = await listed(env, job)
    assert done["state"] == "done" and done["value"] == BEST and done["coordinator"] == ""
    assert f"job: {job}" in log.read_text()
    assert sorted(executions(str(runs))) == list(range(N_CHUNKS))


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_killed_coordinator_is_listed_orphaned_and_its_result_resumes_it(
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
    broker: BrokerSettings,
    tmp_path: Path,
) -> None:
    # Given a detached job of 6 chunks of 1.5 s on 2 slices, its first chunks executing
    await agent_factory("n-orphan")
    path, runs = job_file(tmp_path, sleep_s=1.5, slices=2)
    env = user_env(broker, tmp_path)
    started = await cli(env, "run", str(path), "--detach", "--json")
    assert started.returncode == 0, started.stderr[-3000:]
    said = json.loads(started.stdout)
    job, pid = said["job"], said["pid"]
    await eventually(lambda: len(os.listdir(runs)) >= 2, timeout_s=30)
    # When its coordinator is killed -9 (nothing of its own runs on the way out)
    os.kill(pid, signal.SIGKILL)
    # Then within a few heartbeats the job is listed orphaned, with how to resume it
    orphaned: dict[str, Any] = {}

    async def is_orphaned() -> bool:
        orphaned.update(await listed(env, job))
        return orphaned.get("state") == ORPHANED

    await eventually(is_orphaned, timeout_s=30, interval_s=0.5)
    assert str(path) in orphaned["resume"] and orphaned["coordinator"] == ""
    assert orphaned["n_done"] < N_CHUNKS
    shown = await cli(env, "job", job)
    assert f"coordinator gone; resume with: vramfabric run --detach {path}" in shown.stdout
    assert "1 job(s) orphaned" in (await cli(env, "jobs")).stderr
    # When another connection asks for its result
    fabric = await fabric_factory()
    handle = fabric.job(job)
    assert (await handle.status()).state == ORPHANED
    result = await handle.result(timeout_s=90)
    # Then the job was resumed to completion, its aggregate that of every chunk
    assert (result.value, result.n_ok, result.n_failed) == (tuple(BEST), N_CHUNKS, 0)
    status = await handle.status()
    assert (status.state, status.n_done, status.alive) == ("done", N_CHUNKS, False)
    # Every chunk ran (at least once: a chunk running when the killed coordinator's leases
    # ran out is stopped with its lease and runs again; its result is folded once)
    assert set(executions(str(runs))) == set(range(N_CHUNKS))


@pytest.mark.timeout(120)
async def test_cancel_stops_a_detached_job_and_its_coordinator(
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
    broker: BrokerSettings,
    tmp_path: Path,
) -> None:
    # Given a detached job of 6 chunks of 3 s on 1 slice, its first chunk executing
    await agent_factory("n-cancel")
    path, runs = job_file(tmp_path, sleep_s=3.0, slices=1)
    env = user_env(broker, tmp_path)
    started = await cli(env, "run", str(path), "--detach", "--json")
    assert started.returncode == 0, started.stderr[-3000:]
    job, pid = json.loads(started.stdout)["job"], json.loads(started.stdout)["pid"]
    await eventually(lambda: len(os.listdir(runs)) >= 1, timeout_s=30)
    handle = (await fabric_factory()).job(job)
    assert (await handle.status()).driver is not None
    # When the user cancels it through its handle
    assert await handle.cancel()
    # Then its coordinator stops, the job is cancelled with chunks left unrun, and waiting
    # for its result says so
    await eventually(lambda: not alive(pid), timeout_s=30, interval_s=0.1)
    status = await handle.status()
    assert (status.state, status.alive) == ("cancelled", False)
    assert status.n_done < N_CHUNKS
    with pytest.raises(JobCancelled):
        await handle.result(timeout_s=30)
    assert not await handle.cancel()


@pytest.mark.timeout(120)
async def test_a_stopped_run_is_orphaned_at_once_and_a_rerun_drives_it_again(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, broker: BrokerSettings
) -> None:
    # Given a job of 4 chunks of 1 s run from Python, listed running with its driver
    await agent_factory("n-stop")
    fabric = await fabric_factory()
    await eventually(lambda: bool(fabric.fleet.adverts))
    job = Job(SLEEPY, [sleepy_input(i) for i in range(4)], args={"sleep_s": 1.0})
    run = asyncio.create_task(fabric.run(job, ArgMax(), slices=1))
    job_id = job.spec(fabric.settings).job_id

    async def listed_as(state: str) -> joblist.JobInfo | None:
        page = await joblist.list_jobs(fabric.conn, broker, "default")
        info = next((i for i in page.jobs if i.job == job_id), None)
        return info if info is not None and info.state == state else None

    async def running() -> bool:
        return await listed_as("running") is not None

    await eventually(running, timeout_s=20)
    info = await listed_as("running")
    assert info is not None and info.coordinator.startswith(f"pid {os.getpid()} ")
    # When its coordinator stops it (Ctrl-C in a script: the task is cancelled)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # Then it is listed orphaned at once (no heartbeat to wait out), saying how to resume
    orphaned = await listed_as(ORPHANED)
    assert orphaned is not None and "Fabric.run" in orphaned.resume
    # And without a job file, result() cannot resume it and says how
    with pytest.raises(ValueError, match=r"run the same Job again with Fabric\.run"):
        await fabric.job(job_id).result(ArgMax(), timeout_s=30)
    # When the same Job runs again, it finishes, and its driver is gone with it
    result = await fabric.run(job, ArgMax(), slices=1, timeout_s=60)
    assert result.value == (3, 3.0)
    done = await listed_as("done")
    assert done is not None and done.coordinator == ""
    # And its result can be read back by id with an aggregator given
    again = await fabric.job(job_id).result(ArgMax(), timeout_s=30)
    assert (again.value, again.n_ok) == ((3, 3.0), 4)


async def test_a_jobs_bucket_made_before_heartbeats_takes_them_once_opened(
    conn: Connection, broker: BrokerSettings
) -> None:
    # Given a jobs bucket's stream made by an older version: no per-message TTLs
    config = buckets.jobs_stream_config(broker)
    config.allow_msg_ttl = False
    await conn.js.add_stream(config)
    # When a coordinator opens it
    await buckets.jobs_bucket(conn.js, broker)
    # Then it takes per-message TTLs (heartbeats expire), and still no rollups
    info = await conn.js.stream_info(str(config.name))
    assert info.config.allow_msg_ttl and not info.config.allow_rollup_hdrs
