"""A tenant's login that names another tenant (a forgotten VRAMFABRIC_TENANT) is told so."""

from __future__ import annotations

import time

import pytest

from tests.authsetup import PROMPT_S, AuthFabric
from vramfabric.broker.errors import PermissionDenied
from vramfabric.coordinator import CoordinatorSettings, Fabric


async def test_a_login_without_its_tenant_is_told_which_tenant_to_set(
    auth_fabric: AuthFabric,
) -> None:
    # Given alice's login, and coordinator settings with no tenant (so 'default')
    settings = CoordinatorSettings()
    assert settings.tenant == "default"
    # When a coordinator connects with them
    t0 = time.monotonic()
    with pytest.raises(PermissionDenied) as refused:
        await Fabric.connect(auth_fabric.tenant("alice"), settings)
    # Then it is refused at once, in words that name the setting and its value
    assert time.monotonic() - t0 < PROMPT_S
    message = str(refused.value)
    assert "tenant 'default' is not this login's" in message
    assert "it logged in as 'alice'" in message and "set VRAMFABRIC_TENANT=alice" in message


async def test_a_login_of_its_own_tenant_connects(auth_fabric: AuthFabric) -> None:
    # Given bob's login and his own tenant; when he connects, then nothing is refused
    fabric = await Fabric.connect(auth_fabric.tenant("bob"), CoordinatorSettings(tenant="bob"))
    await fabric.close()
