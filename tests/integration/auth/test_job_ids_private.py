"""Job ids are their tenant's alone: not in adverts, and `status` shows a tenant its own only."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import attrs
from nats.aio.msg import Msg

from tests.authsetup import AuthFabric
from tests.helpers import eventually
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator.leases.fleet import stored_adverts
from vramfabric.coordinator.leases.leasing import LeasePool

ALICE_JOB, BOB_JOB = "alicesecretjob", "bobownjob"


def status_as(settings: BrokerSettings, tenant: str = "") -> dict[str, Any]:
    """`vramfabric status --json` run as the user of `settings` (a process of its own)."""
    env = {
        **os.environ,
        "VRAMFABRIC_NATS_URL": settings.url,
        "VRAMFABRIC_PREFIX": settings.prefix,
        "VRAMFABRIC_NATS_USER": settings.user or "",
        "VRAMFABRIC_NATS_PASSWORD": settings.password or "",
        "VRAMFABRIC_TENANT": tenant,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "vramfabric", "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ALICE_JOB not in proc.stdout or tenant != "bob", proc.stdout
    return dict(json.loads(proc.stdout))


async def test_a_tenant_sees_neither_in_adverts_nor_in_status_another_tenants_job_ids(
    auth_fabric: AuthFabric, agents: Any, fabrics: Any
) -> None:
    # Given alice holding two slices for a job and bob one for his, on one node
    await agents("priv1")
    alice, bob = await fabrics("alice"), await fabrics("bob")
    await eventually(lambda: len(alice.fleet.adverts) == 1 and len(bob.fleet.adverts) == 1)
    # (leases of a minute: the fabrics' own 3 s would lapse while `status` starts, twice)
    a_settings, b_settings = (attrs.evolve(f.settings, lease_ttl_s=60.0) for f in (alice, bob))
    a_pool = LeasePool(alice.conn, alice.broker, a_settings, alice.fleet, ALICE_JOB)
    b_pool = LeasePool(bob.conn, bob.broker, b_settings, bob.fleet, BOB_JOB)
    assert await a_pool.acquire(2) == 2 and await b_pool.acquire(1) == 1
    # When bob reads the adverts as they come and as they are stored
    heard: list[bytes] = []

    async def keep(msg: Msg) -> None:
        heard.append(msg.data)

    sub = await bob.conn.nc.subscribe(bob.broker.subjects.advert_filter(), cb=keep)
    await eventually(lambda: len(heard) >= 2)
    await sub.unsubscribe()
    stored = await stored_adverts(bob.conn, bob.broker)
    # Then no advert names alice's job, though they still say what each tenant holds
    assert heard and stored
    assert all(ALICE_JOB.encode() not in data for data in [*heard, *stored.values()])
    assert bob.fleet.adverts["priv1"].leases == {"alice": 2, "bob": 1}
    # And `status` shows bob his own job's leases only, and the operator everyone's
    mine = await asyncio.to_thread(status_as, auth_fabric.tenant("bob"), "bob")
    assert mine["leases_by_job"] == {f"bob.{BOB_JOB}": 1}
    assert mine["leases_by_tenant"] == {"alice": 2, "bob": 1}
    everyone = await asyncio.to_thread(status_as, auth_fabric.operator)
    assert everyone["leases_by_job"] == {f"alice.{ALICE_JOB}": 2, f"bob.{BOB_JOB}": 1}
    await a_pool.release()
    await b_pool.release()
