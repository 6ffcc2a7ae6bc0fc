"""A tenant added to (or removed from) the tenants file of a running fabric, without a restart."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.helpers import eventually, wait_for_line
from tests.kernels_for_tests import SLEEPY, sleepy_input
from vramfabric.authserver import AuthServer
from vramfabric.broker import auth, tenants
from vramfabric.broker.connection import connect
from vramfabric.broker.errors import PermissionDenied
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import CoordinatorSettings, Fabric, Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.worker import Agent, WorkerSettings

BEFORE = """
[operator]
password = "op-secret"
[workers]
password = "worker-secret"
[tenants.alice]
password = "alice-secret"
"""
DAVE = '[tenants.dave]\npassword = "dave-secret"\nquota = "1GiB"\n'


@pytest.fixture
def authed(tmp_path: Path) -> Iterator[AuthServer]:
    """A server with auth on from a tenants file that holds alice only."""
    path = tmp_path / "tenants.toml"
    path.write_text(BEFORE)
    base = BrokerSettings(prefix=f"r{uuid.uuid4().hex[:8]}", node_ttl_s=2.0)
    server = AuthServer(path, base, "op-secret").start()
    try:
        yield server
    finally:
        server.stop()


def as_user(authed: AuthServer, user: str, password: str) -> BrokerSettings:
    """Settings of one user of that server."""
    return auth.settings_for(attrs.evolve(authed.broker, url=authed.server.url), user, password)


async def test_a_tenant_added_to_the_file_runs_a_job_on_the_running_fabric(
    authed: AuthServer,
) -> None:
    # Given a running fabric (a node, and alice connected) whose tenants file lacks dave
    workers = as_user(authed, tenants.WORKERS_USER, "worker-secret")
    settings = WorkerSettings(
        node="n-reload",
        simulate="1x4GiB",
        slice_bytes=2**30,
        heartbeat_s=0.2,
        kernel_modules=("tests.kernels_for_tests",),
        tenants_file=str(authed.policy_file),
    )
    agent = Agent(workers, settings, await connect(workers, name="n-reload"))
    await agent.start()
    alice = await connect(as_user(authed, "alice", "alice-secret"), name="alice")
    dave = as_user(authed, "dave", "dave-secret")
    fabric: Fabric | None = None
    try:
        with pytest.raises(PermissionDenied):
            await connect(dave, name="dave")
        # When the operator adds dave (with a 1-slice quota) to the file and it is applied
        authed.tenants_path.write_text(BEFORE + DAVE)
        assert authed.changed()
        assert await asyncio.to_thread(authed.reload) == 2
        # Then dave logs in, sees the node and runs a job on it, held to his quota
        fabric = await Fabric.connect(dave, CoordinatorSettings(tenant="dave", slice_bytes=2**30))
        await eventually(lambda: "n-reload" in fabric.fleet.adverts)
        job = Job(SLEEPY, [sleepy_input(i) for i in range(4)], args={"sleep_s": 0.05})
        done = await fabric.run(job, Gather(), slices=4, timeout_s=30)
        assert done.ok and [x.tolist() for x in done.value] == [[float(i)] for i in range(4)]
        assert done.leases_peak == 1
        # And alice's connection lived through the reload
        assert alice.nc.is_connected
        await alice.nc.flush(timeout=2)
    finally:
        if fabric is not None:
            await fabric.close()
        await alice.close()
        await agent.stop(grace_s=0.5)
        await agent.conn.close()


def test_the_server_command_follows_the_file_and_keeps_running_on_a_bad_one(
    tmp_path: Path,
) -> None:
    # Given `vramfabric server --tenants` running with alice only
    path = tmp_path / "tenants.toml"
    path.write_text(BEFORE)
    env = dict(os.environ, VRAMFABRIC_PREFIX=f"r{uuid.uuid4().hex[:8]}")
    env.pop("VRAMFABRIC_NATS_PASSWORD", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramfabric", "server", "--port", "-1", "--tenants", str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = wait_for_line(proc.stdout, "nats-server ready", timeout_s=30)
        url = ready.split("VRAMFABRIC_NATS_URL=")[1].split()[0]
        # When the file is rewritten with a syntax error
        path.write_text(BEFORE + "[tenants.dave\n")
        # Then the server says so on stderr and keeps running with the tenants it had
        wait_for_line(proc.stderr, "tenants not reloaded", timeout_s=15)
        assert proc.poll() is None
        # And when the file is fixed, with dave added, the server applies it
        path.write_text(BEFORE + DAVE)
        wait_for_line(proc.stdout, "tenants reloaded: 2 tenant(s)", timeout_s=15)
        base = BrokerSettings(url=url, prefix=env["VRAMFABRIC_PREFIX"])
        check = subprocess.run(
            [sys.executable, "-c", _LOGIN, url, base.prefix],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert check.returncode == 0, check.stderr[-2000:]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# Logs in as dave and as alice, in a fresh process.
_LOGIN = """
import asyncio, sys
from vramfabric.broker import auth
from vramfabric.broker.connection import connect
from vramfabric.broker.settings import BrokerSettings
async def main():
    base = BrokerSettings(url=sys.argv[1], prefix=sys.argv[2])
    for user in ("dave", "alice"):
        conn = await connect(auth.settings_for(base, user, user + "-secret"))
        await conn.close()
asyncio.run(main())
"""
