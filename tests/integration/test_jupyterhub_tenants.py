"""FabricTenants, the hub's pre-spawn hook, against a running `vramfabric server --tenants`.

No hub here: the hook is called with what it reads of a JupyterHub spawner (the user's name
and the environment it fills). tests/integration/test_jupyterhub.py runs it in a real hub.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.hubfabric import Fabric
from vramfabric.broker.errors import PermissionDenied
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import CoordinatorSettings
from vramfabric.coordinator import Fabric as Coordinator
from vramfabric.jupyterhub import FabricTenants


@attrs.frozen
class HubUser:
    """A hub user, as the hook reads it."""

    name: str


@attrs.frozen
class Spawner:
    """What the hook reads and fills of a JupyterHub spawner."""

    user: HubUser
    environment: dict[str, str] = attrs.field(factory=dict)


@pytest.fixture
def fabric(tmp_path: Path) -> Iterator[Fabric]:
    """`vramfabric server --tenants` following a file that holds the staff's tenant only."""
    started = Fabric(tmp_path).start()
    try:
        started.wait_server()
        yield started
    finally:
        started.stop()


@pytest.mark.slow
async def test_a_first_spawn_makes_a_tenant_that_logs_in_at_once(fabric: Fabric) -> None:
    # Given the hub's hook for that fabric
    hook = FabricTenants(fabric.tenants_file, fabric.url, prefix=fabric.prefix)
    spawner = Spawner(HubUser("Alice.Smith"))
    # When Alice.Smith's server is spawned for the first time
    t0 = time.monotonic()
    await hook(spawner)
    first_s = time.monotonic() - t0
    # Then her server's environment names the fabric and her own tenant, with its password
    env = spawner.environment
    assert env["VRAMFABRIC_TENANT"] == env["VRAMFABRIC_NATS_USER"] == "alice_smith"
    assert (env["VRAMFABRIC_NATS_URL"], env["VRAMFABRIC_PREFIX"]) == (fabric.url, fabric.prefix)
    # And with it alone a coordinator connects as that tenant at once (the server took it)
    coordinator = await Coordinator.connect(
        BrokerSettings.from_env(env), CoordinatorSettings.from_env(env)
    )
    await coordinator.close()
    # And her next spawn gives the same login without waiting for the server
    again = Spawner(HubUser("Alice.Smith"))
    t0 = time.monotonic()
    await hook(again)
    assert again.environment == env
    assert time.monotonic() - t0 < first_s
    print(f"first spawn waited {first_s:.2f}s for the server to take the tenant")


@pytest.mark.slow
async def test_a_spawn_whose_name_is_taken_fails_clearly_and_a_forgotten_tenant_says_so(
    fabric: Fabric,
) -> None:
    # Given the tenant alice_smith, made for hub user Alice.Smith
    hook = FabricTenants(fabric.tenants_file, fabric.url, prefix=fabric.prefix)
    alice = Spawner(HubUser("Alice.Smith"))
    await hook(alice)
    before = fabric.tenants_file.read_text()
    # When hub user alice_smith (the same tenant name) spawns
    with pytest.raises(ValueError) as refused:
        await hook(Spawner(HubUser("alice_smith")))
    # Then the spawn fails naming both users, and the tenants file is as it was
    assert "belongs to hub user 'Alice.Smith'" in str(refused.value)
    assert fabric.tenants_file.read_text() == before
    # And a client with Alice's login but no VRAMFABRIC_TENANT is told what to set
    env = {k: v for k, v in alice.environment.items() if k != "VRAMFABRIC_TENANT"}
    with pytest.raises(PermissionDenied, match="set VRAMFABRIC_TENANT=alice_smith"):
        await Coordinator.connect(BrokerSettings.from_env(env), CoordinatorSettings.from_env(env))
