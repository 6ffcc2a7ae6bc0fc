"""A server of one's own whose users share one account: VRAMFABRIC_TENANT_ACCOUNTS=0."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from tests.helpers import eventually
from tests.kernels_for_tests import SLEEPY, sleepy_input
from vramfabric.broker import auth
from vramfabric.broker.connection import connect
from vramfabric.broker.server import NatsServer
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import CoordinatorSettings, Fabric, Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.worker import Agent, WorkerSettings


async def test_a_job_runs_on_a_one_account_server_with_users(tmp_path: Path) -> None:
    # Given a JetStream server of one's own: two users with passwords, one account
    config = {
        "listen": "127.0.0.1:-1",
        "jetstream": {},
        "accounts": {
            "APP": {
                "jetstream": "enabled",
                "users": [
                    {"user": "node", "password": "node-secret"},
                    {"user": "lab", "password": "lab-secret"},
                ],
            }
        },
    }
    path = tmp_path / "server.json"
    path.write_text(json.dumps(config))
    with NatsServer(config_file=str(path), store_dir=str(tmp_path / "js")) as server:
        base = BrokerSettings(
            url=server.url, prefix=f"s{uuid.uuid4().hex[:8]}", tenant_accounts=False
        )
        # When a worker and a tenant's coordinator log in there, told it is one account
        workers = auth.settings_for(base, "node", "node-secret")
        settings = WorkerSettings(
            node="one",
            simulate="1x2GiB",
            slice_bytes=2**30,
            heartbeat_s=0.2,
            kernel_modules=("tests.kernels_for_tests",),
        )
        agent = Agent(workers, settings, await connect(workers, name="one"))
        await agent.start()
        lab = auth.settings_for(base, "lab", "lab-secret")
        coordinator = CoordinatorSettings(tenant="lab", slice_bytes=2**30)
        try:
            async with await Fabric.connect(lab, coordinator) as fabric:
                await eventually(lambda: "one" in fabric.fleet.adverts)
                job = Job(SLEEPY, [sleepy_input(i) for i in range(4)], args={"sleep_s": 0.01})
                done = await fabric.run(job, Gather(), slices=2, timeout_s=30)
        finally:
            await agent.stop(grace_s=0.5)
            await agent.conn.close()
    # Then the job ran as on a fabric without auth
    assert done.ok and [x.tolist() for x in done.value] == [[float(i)] for i in range(4)]
