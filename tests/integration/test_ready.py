"""A worker that says ready runs chunks at once, its executors still starting (issue 17).

A simulated worker of this uid with no kernel modules says ready before its executors
start (worker/pool.py, `vouched`): spares come up in the background, one GPU at a time. A
job sent the moment it is ready must still run every chunk, on every GPU, correctly.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers import eventually
from tests.integration.conftest import FabricFactory
from vramfabric.broker import BrokerSettings
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
