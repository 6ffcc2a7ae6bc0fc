"""Retention and blob collection: what no job needs goes, what a running job needs stays."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import nats.js.errors
import pytest

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker import BrokerSettings, buckets
from vramfabric.broker.errors import JobNotFound
from vramfabric.coordinator import Gather, Job
from vramfabric.coordinator.jobs import joblist
from vramfabric.coordinator.jobs.collect import BLOB_MIN_AGE_S, housekeep


def double(x: int) -> int:
    """A finished job's function."""
    return 2 * x


def slow_triple(arg: tuple[int, str]) -> int:
    """A running job's function: marks that it started, then takes a while."""
    x, marks = arg
    Path(marks, f"{x}-{os.getpid()}").touch()
    time.sleep(4.0)  # stands in for a long computation
    return 3 * x


async def test_housekeeping_removes_old_jobs_and_unnamed_blobs_and_keeps_a_running_jobs(
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
    broker: BrokerSettings,
    tmp_path: Path,
) -> None:
    # Given a finished job and a running one, each with its function uploaded
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    await eventually(lambda: bool(fabric.fleet.adverts))
    finished = await fabric.run(Job(double, [1, 2]), Gather())
    running_job = Job(slow_triple, [(1, str(tmp_path))])
    running = asyncio.create_task(fabric.run(running_job, Gather()))
    await eventually(lambda: bool(os.listdir(tmp_path)), timeout_s=30)
    store = await buckets.kernels_store(fabric.conn.js, broker, "default")
    digests = {info.name for info in await store.list(ignore_deletes=True)}
    assert len(digests) == 2
    # When housekeeping runs past the finished job's retention and the blobs' upload grace
    later = time.time() + BLOB_MIN_AGE_S + 60
    done = await housekeep(fabric.conn, broker, "default", 1.0, later)
    # Then the finished job and its function are gone
    assert done.jobs == (finished.job_id,)
    with pytest.raises(JobNotFound):
        await joblist.inspect(fabric.conn, broker, "default", finished.job_id)
    (gone,) = done.blobs
    with pytest.raises(nats.js.errors.ObjectNotFoundError):
        await store.get(gone)
    # And the running job keeps its function, and finishes
    (kept,) = digests - {gone}
    assert (await store.get(kept)).data
    assert (await running).value == [3]
    # And a second pass finds nothing more to remove while the job is stored
    again = await housekeep(fabric.conn, broker, "default", 0.0, later)
    assert again.jobs == () and again.blobs == ()
