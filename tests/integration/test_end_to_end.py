"""The whole path as a user meets it: the demo command, the CLI, no process left behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import children_of, eventually, kill_and_close, survivors_of_kill, wait_for_line
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker import BrokerSettings
from vramfabric.broker.cluster import free_ports
from vramfabric.broker.errors import Disconnected
from vramfabric.coordinator import ArgMin, Job
from vramfabric.coordinator.run import jobrun as jobrun_module
from vramfabric.demo import HYPERPARAM_RTOL, reference_argmin
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space

CLI = [sys.executable, "-m", "vramfabric"]


async def test_search_through_the_fabric_equals_the_direct_reference_argmin(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given two nodes and the 1000-configuration search
    await agent_factory("n1", simulate="4x80GiB", slice_bytes=512 * 2**20)
    await agent_factory("n2", simulate="4x80GiB", slice_bytes=512 * 2**20)
    fabric = await fabric_factory(slice_bytes=512 * 2**20, max_slices=1000)
    configs = search_space(1000)
    # When it runs through the fabric, one configuration per message (packed, its few packs
    # would need few leases: test_packing.py)
    job = Job(HYPERPARAM_EVAL, [encode_config(*c) for c in configs], chunks_per_message=1)
    result = await fabric.run(job, ArgMin(), timeout_s=60)
    # Then the best configuration is the one the reference finds directly (the workers ran
    # hyperparam.cu on their host path: its loss is the reference's within 2e-6)
    index, loss = reference_argmin(configs)
    assert result.n_ok == 1000 and result.leases_peak == 1000
    assert result.value[0] == index
    assert result.value[1] == pytest.approx(loss, rel=HYPERPARAM_RTOL)
    # And every lease went back, as the coordinator's metrics show too
    assert result.lease_history[-1][1] == 0
    assert fabric.metrics.value("chunks_done_total") == 1000
    assert fabric.metrics.value("job_leases_held") == 0


@pytest.mark.parametrize("auth", [(), ("--auth",)], ids=["auth-off", "auth-on"])
def test_demo_command_prints_the_verified_best_and_leaves_nothing_behind(
    auth: tuple[str, ...],
) -> None:
    # When a user runs the README's demo (with auth off, or on with a generated tenants file)
    proc = subprocess.run(
        [*CLI, "demo", "--json", *auth], capture_output=True, text=True, timeout=120
    )
    # Then it succeeds with the best of 1000 configurations, verified against the reference
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ok"] == 1000 and summary["failed"] == 0
    assert summary["matches_reference"] is True
    assert summary["best_index"] == reference_argmin(search_space(1000))[0]
    # And no lease, worker or server outlives it
    assert summary["leased_bytes_after"] == 0
    assert summary["worker_exit_codes"] == [0, 0]
    assert summary["auth"] is bool(auth)


def test_killing_the_demo_leaves_no_server_or_worker_process() -> None:
    # Given a demo whose server and workers are running
    proc = subprocess.Popen(
        [*CLI, "-vv", "demo", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_for_line(proc.stderr, "agent started", timeout_s=30)
        kids = children_of(proc.pid)
        assert kids, "the demo has child processes"
        # When the demo is killed -9 (no cleanup code can run), then the kernel takes its
        # children down with it
        assert survivors_of_kill(proc, kids) == []
    finally:
        kill_and_close(proc)


def test_cli_run_and_status_against_a_running_fabric(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    # Given a running worker on the test server
    env = dict(os.environ, VRAMFABRIC_NATS_URL=broker.url, VRAMFABRIC_PREFIX=broker.prefix)
    worker = subprocess.Popen(
        [*CLI, "worker", "--simulate", "2x8GiB", "--slice", "512MiB", "--node", "cli-node"],
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        wait_for_line(worker.stdout, "worker ready", timeout_s=20)
        # When a user asks for the status
        client_env = dict(env, VRAMFABRIC_SLICE_BYTES="1GiB")  # not the worker's slice size
        status = subprocess.run(
            [*CLI, "status", "--json"], env=client_env, capture_output=True, text=True, timeout=30
        )
        assert status.returncode == 0, status.stderr
        nodes = json.loads(status.stdout)["nodes"]
        assert [n["node"] for n in nodes] == ["cli-node"]
        assert sum(g["free_bytes"] for g in nodes[0]["gpus"]) == 16 * 2**30
        # counted in the worker's 512 MiB slices, not the client's VRAMFABRIC_SLICE_BYTES
        assert json.loads(status.stdout)["slices_free"] == 32
        # And runs a JOB.toml
        jobfile = tmp_path / "job.toml"
        jobfile.write_text(
            'kernel = "hyperparam_eval"\naggregate = "argmin"\nslices = 32\n[inputs]\ngrid = 100\n'
        )
        run = subprocess.run(
            [*CLI, "run", str(jobfile), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        # Then the job's argmin is the reference's over those 100 configurations
        assert run.returncode == 0, run.stderr[-3000:]
        report = json.loads(run.stdout)
        assert report["ok"] == 100 and report["failed"] == 0
        assert report["value"][0] == reference_argmin(search_space(100))[0]
        assert report["leases_peak"] == 32
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
        assert worker.stdout is not None
        worker.stdout.close()


@pytest.mark.parametrize(
    "content, message",
    [
        ('aggregate = "argmin"\n[inputs]\ngrid = 10\n', "missing key 'kernel'"),
        ('kernel = "nope"\n[inputs]\ngrid = 10\n', "unknown kernel"),
        (
            'kernel = "hyperparam_eval"\naggregate = "median"\n[inputs]\ngrid = 10\n',
            "unknown aggregator",
        ),
        ('kernel = "hyperparam_eval"\n[inputs]\nglob = "none/*.bin"\n', "matches no file"),
        ("kernel = [", "cannot read"),
        (
            'kernel = "hyperparam_eval"\n[inputs]\ngrid = 10\n',
            "missing key 'aggregate' (argmin, argmax, mean, topk, gather or collect)",
        ),
        (
            'kernel = "hyperparam_eval"\naggregate = "argmin"\n[args]\nxs = [1, 2]\n'
            "[inputs]\ngrid = 10\n",
            "job arg 'xs' must be a str key with an int, float, str, bytes or bool value",
        ),
        (
            'kernel = "hyperparam_eval"\naggregate = "argmin"\nargs = 5\n[inputs]\ngrid = 10\n',
            "args must be a table",
        ),
    ],
)
def test_cli_run_rejects_a_bad_job_file_with_a_clear_message(
    tmp_path: Path, content: str, message: str
) -> None:
    # Given a job file with a mistake
    jobfile = tmp_path / "job.toml"
    jobfile.write_text(content)
    # When it is run
    env = {**os.environ, "COLUMNS": "1000"}  # one line per message: no console wrapping
    proc = subprocess.run(
        [*CLI, "run", str(jobfile)], capture_output=True, text=True, timeout=30, env=env
    )
    # Then the CLI exits with a usage error naming the problem, before connecting anywhere
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert message in proc.stderr


def test_a_command_against_a_closed_port_says_connection_refused() -> None:
    # Given a URL where no server listens
    (port,) = free_ports(1)
    env = {**os.environ, "VRAMFABRIC_NATS_URL": f"nats://127.0.0.1:{port}", "COLUMNS": "1000"}
    # When a command connects there
    proc = subprocess.run([*CLI, "status"], capture_output=True, text=True, timeout=60, env=env)
    # Then it exits 3 with one line that names the cause, not a timeout after a page of warnings
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"vramfabric: cannot reach NATS at nats://127.0.0.1:{port}: "
        "connection refused (no server listens there)"
    ]


async def test_a_run_that_fails_before_leasing_leaves_nothing_following_its_results(
    fabric_factory: FabricFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a fabric whose check for earlier results fails (the server went away, say)
    fabric = await fabric_factory()
    tasks_before = len(asyncio.all_tasks())

    async def unavailable(*_args: object) -> set[int]:
        raise Disconnected("results stream unreachable")

    monkeypatch.setattr(jobrun_module, "finished_chunks", unavailable)
    inputs = [encode_config(*c) for c in search_space(4)]
    # When a job runs, it fails with that error
    with pytest.raises(Disconnected):
        await fabric.run(Job(HYPERPARAM_EVAL, inputs), ArgMin(), timeout_s=10)
    # Then the results and dead-letter followers it had started are stopped: no task of theirs
    # (a consumer watchdog each) keeps running on the caller's connection
    await eventually(lambda: len(asyncio.all_tasks()) <= tasks_before, timeout_s=5)


class _BreaksOnChunk2:
    """An aggregator with a bug that shows on one chunk's output."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def add(self, index: int, output: bytes) -> None:
        if index == 2:
            raise ValueError(f"cannot fold chunk {index} ({len(output)} bytes)")
        self.seen.append(index)

    def value(self) -> list[int]:
        return sorted(self.seen)


async def test_an_aggregator_that_raises_stops_the_run_with_its_error(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node, and an aggregator that raises on chunk 2's output
    await agent_factory("n-agg")
    fabric = await fabric_factory()
    await eventually(lambda: bool(fabric.fleet.adverts))
    inputs = [encode_config(*c) for c in search_space(6)]
    # When a job runs with no timeout
    run = fabric.run(Job(HYPERPARAM_EVAL, inputs), _BreaksOnChunk2(), slices=2)
    # Then the run raises the aggregator's error, rather than wait forever for chunk 2
    with pytest.raises(ValueError, match="cannot fold chunk 2"):
        await asyncio.wait_for(run, timeout=30)
