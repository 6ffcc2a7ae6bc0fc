"""Auth on: a tenant's job heartbeat and origin need nothing beyond the tenant's own grants."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.authsetup import AuthFabric
from tests.helpers import eventually
from tests.kernels_for_tests import SLEEPY, sleepy_input
from vramfabric.broker.errors import JobNotFound
from vramfabric.broker.jobdriver import JobOrigin
from vramfabric.coordinator import Fabric, Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.coordinator.jobs import joblist
from vramfabric.coordinator.jobs.driver import ORPHANED, read_origin, write_origin


async def listed(fabric: Fabric, job: str) -> joblist.JobInfo | None:
    """The job as the tenant's own listing shows it."""
    page = await joblist.list_jobs(fabric.conn, fabric.broker, fabric.settings.tenant)
    return next((i for i in page.jobs if i.job == job), None)


@pytest.mark.timeout(60)
async def test_a_tenants_job_beats_is_orphaned_when_stopped_and_only_it_sees_it(
    auth_fabric: AuthFabric, agents: Any, fabrics: Any, tmp_path: Path
) -> None:
    # Given alice's job of 4 chunks of 1 s running with auth on, its origin stored
    await agents("n-beat")
    alice = await fabrics("alice")
    bob = await fabrics("bob")
    await eventually(lambda: bool(alice.fleet.adverts))
    job_id = uuid.uuid4().hex[:12]
    job = Job(SLEEPY, [sleepy_input(i) for i in range(4)], args={"sleep_s": 1.0}, job_id=job_id)
    origin = JobOrigin(job_id, str(tmp_path / "job.toml"), socket.gethostname())
    await write_origin(alice.conn, alice.broker, "alice", origin)
    run = asyncio.create_task(alice.run(job, Gather(), slices=1, timeout_s=60))
    # When she looks at it by id and in her listing
    handle = alice.job(job_id)

    async def driven() -> bool:
        try:
            return bool((await handle.status()).alive)
        except JobNotFound:  # its spec is not stored yet
            return False

    await eventually(driven, timeout_s=20)
    status = await handle.status()
    info = await listed(alice, job_id)
    # Then her heartbeat and origin are written and read as her own user
    assert status.driver is not None and status.driver.pid == os.getpid()
    assert status.origin == origin
    assert await read_origin(alice.conn, alice.broker, "alice", job_id) == origin
    assert info is not None and info.state == "running"
    assert info.coordinator == f"pid {os.getpid()} on {socket.gethostname()}"
    # And bob finds no such job of his
    with pytest.raises(JobNotFound):
        await bob.job(job_id).status()
    # When her coordinator is stopped mid-run
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # Then the job is orphaned at once, with her job file to resume it from
    info = await listed(alice, job_id)
    assert info is not None and info.state == ORPHANED and origin.jobfile in info.resume
    assert (await handle.status()).state == ORPHANED
    # And she can cancel it by id
    assert await handle.cancel()
    assert (await handle.status()).state == "cancelled"
