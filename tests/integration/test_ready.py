"""A worker that says ready runs chunks at once, its executors still starting (issue 17).

A simulated worker of this uid with no kernel modules says ready before its executors
start (worker/executors/supply.py, `vouched`): spares come up in the background, one GPU at
a time. A job sent the moment it is ready must still run every chunk, on every GPU,
correctly. The node's prebuild of the built-in kernels (kernels/prebuild.py) runs once
per worker process. `vramfabric up` forks its workers (fabric/forked.py): each is still a
node of its own, and none outlives `up`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import (
    children_of,
    eventually,
    kill_and_close,
    survivors_of_kill,
    wait_for_line,
)
from tests.integration.conftest import FabricFactory
from vramfabric.broker import BrokerSettings
from vramfabric.broker.server import die_with_parent
from vramfabric.coordinator import CoordinatorSettings, Fabric, Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.local import LocalFleet


def square_where(i: int) -> tuple[int, int]:
    """The square of `i` and the executor process that computed it."""
    return i * i, os.getpid()


@pytest.mark.timeout(90)
async def test_a_job_sent_at_ready_runs_every_chunk_on_every_gpu(
    broker: BrokerSettings, fabric_factory: FabricFactory
) -> None:
    # Given a fabric connected before the worker starts, and a worker of 4 simulated GPUs
    fabric = await fabric_factory(slice_bytes=2**30)
    fleet = LocalFleet(
        workers=0,
        simulate="4x2GiB",
        slice_size="1GiB",
        prefix=broker.prefix,
        url=broker.url,
        node_ttl_s=broker.node_ttl_s,
        worker_args=("--allow-code",),
    )
    try:
        # When a job of 8 chunks on 8 leases (both slices of every GPU) is sent once it is ready
        fleet.add_worker("ready-0")
        await eventually(lambda: "ready-0" in fabric.fleet.adverts)  # its first advert, heard
        job = Job(square_where, list(range(24)))
        result = await fabric.run(job, Gather(), slices=8, min_slices=8, timeout_s=60)
        # Then every chunk ran once, with the right answer, in the worker's executors
        assert result.n_failed == 0, result.failures
        assert [value for value, _pid in result.value] == [i * i for i in range(24)]
        assert result.leases_peak == 8
        assert fleet.procs[0].pid not in {pid for _value, pid in result.value}
    finally:
        fleet.stop()


@pytest.mark.timeout(60)
async def test_nodes_side_by_side_start_one_prebuild(
    broker: BrokerSettings, fabric_factory: FabricFactory
) -> None:
    # Given a worker process of 3 simulated nodes side by side (they start no spares)
    fabric = await fabric_factory()
    env = dict(os.environ, VRAMFABRIC_NATS_URL=broker.url, VRAMFABRIC_PREFIX=broker.prefix)
    args = ["--simulate", "1x4GiB", "--node", "trio", "--nodes", "3", "-v"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramfabric.worker", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=die_with_parent,
    )
    try:
        assert proc.stdout is not None and b"worker ready" in proc.stdout.readline()
        # When it has been up for a few heartbeats (each node idle since it started)
        since = time.time()
        await eventually(
            lambda: all(
                (a := fabric.fleet.adverts.get(f"trio-{i}")) is not None and a.sent_at > since + 3
                for i in range(3)
            ),
            timeout_s=20,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=20)
    # Then the process built (or found built) the built-in kernels once, not once per node
    assert err.decode().count("built-in host kernels:") == 1, err.decode()[-3000:]


def parent_pid(_i: int) -> int:
    """The PID of the worker that started this executor process."""
    return os.getppid()


@pytest.mark.timeout(120)
async def test_up_forks_workers_that_each_run_chunks_and_die_with_it(tmp_path: Path) -> None:
    # Given `vramfabric up` with two workers of one 4 GiB GPU (8 slices each)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    cmd = ["up", "--workers", "2", "--simulate", "1x4GiB", "--allow-code"]
    up = subprocess.Popen(
        [sys.executable, "-m", "vramfabric", *cmd],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        url = wait_for_line(up.stdout, "vramfabric up:", timeout_s=60).split()[2]
        kids = children_of(up.pid)
        workers = {k for k in kids if b"nats-server" not in Path(f"/proc/{k}/cmdline").read_bytes()}
        assert len(workers) == 2 and len(kids) == 3, kids
        # When a job takes all 16 slices, each chunk saying which worker's executor ran it
        broker = BrokerSettings(url=url)
        async with await Fabric.connect(broker, CoordinatorSettings(max_slices=16)) as fabric:
            job = Job(parent_pid, list(range(32)))
            result = await fabric.run(job, Gather(), slices=16, min_slices=16, timeout_s=60)
        # Then both workers ran chunks, each in executors of its own
        assert result.n_failed == 0, result.failures
        assert set(result.value) == workers
        # And when `up` is killed -9 (no cleanup of its own runs), its workers and server go too
        assert survivors_of_kill(up, kids) == []
    finally:
        kill_and_close(up)


def test_forked_workers_refuse_a_tenants_file(tmp_path: Path) -> None:
    # Given a fleet of forked workers asked to run with a tenants file (passwords inside)
    fleet = LocalFleet(workers=1, fork=True, tenants_file=str(tmp_path / "tenants.toml"))
    # When it starts, then it refuses before reading the file or starting anything
    with pytest.raises(ValueError, match="forked workers take no tenants file"):
        fleet.start()
    assert fleet.server is None and fleet.procs == []


def test_forked_workers_refuse_a_process_with_threads() -> None:
    # Given a process with a second thread running (it could hold a lock at the fork)
    from vramfabric.forked import ForkedWorker

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        # When a worker is forked from it, then it refuses and no child is made
        before = children_of(os.getpid())
        with pytest.raises(RuntimeError, match="one thread"):
            ForkedWorker.start(["--simulate", "1x4GiB"], dict(os.environ), quiet=True)
        assert children_of(os.getpid()) == before
    finally:
        stop.set()
        thread.join()
