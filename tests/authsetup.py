"""A server with auth on: the tenants file of the auth tests, and settings per user."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import attrs
import nkeys
import pytest

from vramfabric.broker import auth, tenants
from vramfabric.broker.errors import PermissionDenied
from vramfabric.broker.settings import BrokerSettings

# A refusal must come from the server's violation report, well before a request timeout.
REQUEST_TIMEOUT_S = 5.0
PROMPT_S = 2.0

TENANTS_TOML = """
[operator]
password = "op-secret"
[workers]
password = "worker-secret"
[tenants.alice]
password = "alice-secret"
quota = "6GiB"
allow_code = true
[tenants.bob]
password = "bob-secret"
[tenants.carol]
nkey = "{carol}"
"""
# carol logs in with an nkey (her seed stays with her; the file holds the public key).
CAROL_SEED = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
TENANTS_TOML = TENANTS_TOML.replace(
    "{carol}", nkeys.from_seed(bytearray(CAROL_SEED)).public_key.decode()
)


@attrs.frozen
class AuthFabric:
    """A server started with the generated config, and settings per user."""

    base: BrokerSettings
    file: tenants.TenantsFile
    path: Path

    def as_user(self, user: str, password: str | None) -> BrokerSettings:
        """Settings connecting as `user`."""
        return auth.settings_for(self.base, user, password)

    @property
    def operator(self) -> BrokerSettings:
        """The operator's settings."""
        return self.as_user(tenants.OPERATOR_USER, "op-secret")

    def operator_of(self, tenant: str) -> BrokerSettings:
        """The operator's settings inside one tenant's account (where its streams are)."""
        return self.as_user(auth.operator_user(tenant), "op-secret")

    @property
    def worker(self) -> BrokerSettings:
        """The node agents' settings."""
        return self.as_user(tenants.WORKERS_USER, "worker-secret")

    def tenant(self, name: str) -> BrokerSettings:
        """A tenant's settings."""
        return self.as_user(name, f"{name}-secret")

    @property
    def policy(self) -> Path:
        """Where the workers' policy file (no credentials) goes."""
        return self.path.with_name("policy.toml")


async def refused(call: Awaitable[Any]) -> float:
    """Await `call`, expecting PermissionDenied; return how long the refusal took."""
    t0 = time.monotonic()
    with pytest.raises(PermissionDenied):
        await call
    return time.monotonic() - t0
