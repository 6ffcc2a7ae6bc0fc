"""A worker that says ready runs chunks at once, its executors still starting (issue 17).

A simulated worker of this uid with no kernel modules says ready before its executors
start (worker/pool.py, `vouched`): spares come up in the background, one GPU at a time. A
job sent the moment it is ready must still run every chunk, on every GPU, correctly. The
node's prebuild of the built-in kernels (kernels/prebuild.py) runs once per worker process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import eventually
from tests.integration.conftest import FabricFactory
from vramfabric.broker import BrokerSettings
from vramfabric.broker.server import die_with_parent
from vramfabric.coordinator import Job
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
