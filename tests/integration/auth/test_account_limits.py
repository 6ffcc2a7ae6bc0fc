"""Auth on: a tenant at its account limits is refused clearly; the others go on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from tests.authsetup import REQUEST_TIMEOUT_S, AuthFabric
from tests.helpers import eventually
from tests.kernels_for_tests import SLEEPY, sleepy_input
from vramfabric.broker import auth, tenants
from vramfabric.broker.errors import LimitExceeded, from_nats
from vramfabric.broker.limits import DEFAULT_LIMITS
from vramfabric.broker.server import NatsServer
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.usage import account_usage
from vramfabric.coordinator import Job
from vramfabric.coordinator.aggregate import Gather

# beta's storage is small; alpha has the defaults of a shared fleet (broker/limits.py).
LIMITS_TOML = """
[operator]
password = "op-secret"
[workers]
password = "worker-secret"
[defaults]
memory_storage = "64MiB"
[tenants.alpha]
password = "alpha-secret"
[tenants.beta]
password = "beta-secret"
storage = "2MiB"
"""
FILL_BYTES = 256 * 1024


@pytest.fixture(scope="module")
def auth_fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthFabric]:
    """This module's own server: alpha with the defaults, beta with 2 MiB of storage."""
    folder = tmp_path_factory.mktemp("limits")
    path = folder / "tenants.toml"
    path.write_text(LIMITS_TOML)
    file = tenants.load(path)
    base = BrokerSettings(
        prefix=f"t{uuid.uuid4().hex[:8]}", node_ttl_s=2.0, request_timeout_s=REQUEST_TIMEOUT_S
    )
    config = auth.write_config(file, base.subjects, folder / "server.json", port=-1)
    server = NatsServer(config_file=str(config), store_dir=str(folder / "js")).start()
    try:
        fabric = AuthFabric(attrs.evolve(base, url=server.url), file, path)
        asyncio.run(auth.provision_tenants(fabric.operator, file))
        yield fabric
    finally:
        server.stop()


async def test_a_tenant_at_its_storage_limit_is_refused_and_others_run_jobs(
    auth_fabric: AuthFabric, connections: Any, agents: Any, fabrics: Any
) -> None:
    # Given beta, whose account may store 2 MiB, writing 256 KiB values to its jobs bucket
    conn = await connections(auth_fabric.tenant("beta"))
    kv = await conn.js.key_value(auth_fabric.base.subjects.jobs_bucket())
    # When beta writes until the server refuses
    with pytest.raises(LimitExceeded) as refusal:
        for i in range(64):  # 16 MiB: far past the limit
            try:
                await kv.put(f"beta.fill{i}", b"x" * FILL_BYTES)
            except Exception as exc:  # mapped as every broker call maps the server's errors
                raise from_nats(exc) from exc
    # Then the refusal names the account's storage limit
    assert "storage limit" in str(refusal.value), refusal.value
    # And alpha's 1,000-chunk job on the same server then completes
    await agents("n-lim", simulate="2x2GiB")
    alpha = await fabrics("alpha")
    await eventually(lambda: bool(alpha.fleet.adverts))
    job = Job(SLEEPY, [sleepy_input(i) for i in range(1000)], args={"sleep_s": 0.0})
    done = await alpha.run(job, Gather(), timeout_s=60)
    assert done.ok and len(done.value) == 1000
    assert [float(x[0]) for x in done.value[:3]] == [0.0, 1.0, 2.0]


def test_the_servers_store_log_and_config_are_its_owners_alone(auth_fabric: AuthFabric) -> None:
    # Given the server this module started from a generated config
    folder = auth_fabric.path.parent
    # Then the store folder is 0700 and the log and the config (passwords) are 0600
    assert (folder / "js").stat().st_mode & 0o777 == 0o700
    assert (folder / "js" / "nats-server.log").stat().st_mode & 0o777 == 0o600
    assert (folder / "server.json").stat().st_mode & 0o777 == 0o600


def test_limits_come_from_the_tenants_file_with_defaults_for_all() -> None:
    # Given a [defaults] table and one tenant that sets its own storage
    file = tenants.parse(tomllib.loads(LIMITS_TOML))
    config = auth.accounts(file, BrokerSettings(prefix="t").subjects)
    # Then each tenant's account carries its limits, the defaults filling the rest
    beta, alpha = config[auth.tenant_account("beta")], config[auth.tenant_account("alpha")]
    assert isinstance(beta, dict) and isinstance(alpha, dict)
    assert beta["jetstream"]["max_file"] == 2 * 2**20
    assert alpha["jetstream"]["max_file"] == DEFAULT_LIMITS.storage_bytes
    assert alpha["jetstream"]["max_mem"] == beta["jetstream"]["max_mem"] == 64 * 2**20
    assert alpha["limits"]["max_payload"] == 2**20
    # And the fabric's account (workers, operator, shared buckets) has none
    fabric = config[auth.FABRIC_ACCOUNT]
    assert isinstance(fabric, dict) and fabric["jetstream"] == "enabled" and "limits" not in fabric
    # And a bad limit is refused naming the table and the key
    with pytest.raises(ValueError, match=r"tenants\.beta\] streams"):
        tenants.parse(tomllib.loads(LIMITS_TOML + 'streams = "many"\n'))


async def test_the_operator_sees_each_tenants_use_against_its_limits(
    auth_fabric: AuthFabric,
) -> None:
    # Given the provisioned accounts of alpha (defaults) and beta (2 MiB of storage)
    # When the operator asks for their use
    rows = {u.tenant: u for u in await account_usage(auth_fabric.operator, ["alpha", "beta"])}
    # Then each shows its limits and the fabric's six streams, counted in its account
    assert rows["beta"].storage_limit_bytes == 2 * 2**20
    assert rows["alpha"].storage_limit_bytes == DEFAULT_LIMITS.storage_bytes
    assert rows["alpha"].streams == 6 and rows["alpha"].streams_limit == DEFAULT_LIMITS.streams
    assert "beta: storage " in rows["beta"].line() and "/2 MiB" in rows["beta"].line()


def test_status_shows_the_operator_each_tenants_use_and_tenants_none(
    auth_fabric: AuthFabric,
) -> None:
    # Given the tenants file; When the operator, then alpha, run `vramfabric status --json`
    def status_as(settings: BrokerSettings) -> dict[str, Any]:
        env = {
            **os.environ,
            "VRAMFABRIC_NATS_URL": settings.url,
            "VRAMFABRIC_PREFIX": settings.prefix,
            "VRAMFABRIC_NATS_USER": settings.user or "",
            "VRAMFABRIC_NATS_PASSWORD": settings.password or "",
            "VRAMFABRIC_TENANT": "alpha",
        }
        cmd = [sys.executable, "-m", "vramfabric", "status", "--json"]
        cmd += ["--tenants", str(auth_fabric.path)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return dict(json.loads(proc.stdout))

    # Then the operator sees each tenant's storage and streams against its limits
    usage = {u["tenant"]: u for u in status_as(auth_fabric.operator)["usage"]}
    assert set(usage) == {"alpha", "beta"}
    assert usage["beta"]["storage_limit_bytes"] == 2 * 2**20
    assert usage["alpha"]["streams"] == 6
    # And a tenant sees no one's
    assert status_as(auth_fabric.tenant("alpha"))["usage"] == []
