"""JupyterHub: every hub user a tenant of their own, made on first spawn, nothing typed.

In `jupyterhub_config.py` (docs/notebooks.md has a whole one):

    from vramfabric.jupyterhub import FabricTenants
    c.Spawner.pre_spawn_hook = FabricTenants(
        tenants_file="/etc/vramfabric/tenants.toml", nats_url="nats://gpu-head:4222"
    )

Before each spawn the hook finds the user's tenant (hubtenants.py: named from the user,
added to the tenants file with a fresh password the first time), and puts the fabric's URL,
prefix, tenant, user and password in the single-user server's environment, where the
kernels' `vramfabric.connect()` and `%%gpu` read them. The fabric's server must follow that
file (`vramfabric server --tenants FILE` does, within a second); a new tenant's spawn waits
until the tenant can log in and its streams are there. JupyterHub is not imported here: the
hook needs only the spawner's `user.name` and `environment`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any, Protocol

import attrs

from vramfabric.broker import topology
from vramfabric.broker.connection import connect
from vramfabric.broker.errors import TransientError
from vramfabric.broker.retrying import CallRetry
from vramfabric.broker.settings import BrokerSettings, check_url

from .hubtenants import HubTenants, TenantDefaults, TenantLogin, tenant_name

log = logging.getLogger(__name__)

__all__ = ["FabricTenants", "TenantLogin", "tenant_name"]

# Between two tries of a new tenant's login while the server takes the tenants file.
_PROBE_PAUSE_S = 0.25


class HubUser(Protocol):
    """What the hook reads of a JupyterHub user."""

    @property
    def name(self) -> str:
        """The hub user name."""


class HubSpawner(Protocol):
    """What the hook uses of a JupyterHub spawner."""

    @property
    def user(self) -> HubUser:
        """The user being spawned."""

    @property
    def environment(self) -> MutableMapping[str, Any]:
        """Variables for the single-user server's environment."""


@attrs.define
class FabricTenants:
    """A `pre_spawn_hook`: the user's tenant, made if missing, in the server's environment.

    Args:
        tenants_file: the file `vramfabric server --tenants` runs with; the hub must be
            able to write it (and the folder it is in).
        nats_url: the fabric's URL as single-user servers reach it (and the hub, which tries
            a new tenant's login there).
        prefix: the fabric's subject prefix.
        allow_code, quota, weight: what a tenant made for a hub user gets (quota "8GiB").
        adopt_existing: hand a tenant the operator wrote to the hub user named after it.
        tenant_name: hub user name -> tenant name, instead of `hubtenants.tenant_name`.
        ready_timeout_s: how long a new tenant's spawn waits for the server to take it.
    """

    tenants_file: str | Path
    nats_url: str = attrs.field(validator=lambda _i, _a, v: check_url(v))
    prefix: str = "vf"
    allow_code: bool = True
    quota: str | None = None
    weight: float = 1.0
    adopt_existing: bool = False
    tenant_name: Callable[[str], str] = tenant_name
    ready_timeout_s: float = 60.0
    _hub: HubTenants = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        """Check the settings at hub start, not at the first spawn."""
        BrokerSettings(url=self.nats_url, prefix=self.prefix)
        defaults = TenantDefaults(self.allow_code, self.quota, self.weight)
        self._hub = HubTenants(Path(self.tenants_file), defaults, self.adopt_existing)

    async def __call__(self, spawner: HubSpawner) -> None:
        """Give the spawner's user its tenant: made (and waited for) if new, then its env.

        Raises:
            ValueError: the user's tenant name is another hub user's, or the operator's.
        """
        login = await asyncio.to_thread(self.claim, spawner.user.name)
        if login.created:
            await self.wait_ready(login)
        spawner.environment.update(self.environment(login))

    def claim(self, hub_user: str) -> TenantLogin:
        """The hub user's tenant, added to the tenants file if missing (no waiting).

        Also a way to make the tenants of a class before it starts: each tenant added
        makes the fabric's server restart (docs/notebooks.md).
        """
        login = self._hub.claim(hub_user, self.tenant_name(hub_user))
        if login.created:
            log.info("tenant added for hub user tenant=%s user=%r", login.tenant, hub_user)
        return login

    def environment(self, login: TenantLogin) -> dict[str, str]:
        """The single-user server's `VRAMFABRIC_*` variables for that tenant."""
        return {
            "VRAMFABRIC_NATS_URL": self.nats_url,
            "VRAMFABRIC_PREFIX": self.prefix,
            "VRAMFABRIC_TENANT": login.tenant,
            "VRAMFABRIC_NATS_USER": login.tenant,
            "VRAMFABRIC_NATS_PASSWORD": login.password,
        }

    async def wait_ready(self, login: TenantLogin) -> bool:
        """Wait until the tenant logs in and finds its streams; False (logged) at the deadline.

        The spawn goes on either way: the notebook works without the fabric, and its first
        `%%gpu` cell says what is wrong if the server never takes the tenant.
        """
        t0 = time.monotonic()
        retry = CallRetry(
            deadline_s=self.ready_timeout_s, pause_s=_PROBE_PAUSE_S, max_pause_s=_PROBE_PAUSE_S
        )
        try:
            await retry.call(lambda: self._probe(login), what=f"tenant {login.tenant} ready")
        except TransientError as exc:
            log.warning(
                "tenant not taken by the fabric's server within %.0fs tenant=%s file=%s "
                "(is `vramfabric server --tenants` running with it?) last_error=%s",
                self.ready_timeout_s,
                login.tenant,
                self.tenants_file,
                exc,
            )
            return False
        log.info("tenant ready tenant=%s after_s=%.2f", login.tenant, time.monotonic() - t0)
        return True

    async def _probe(self, login: TenantLogin) -> None:
        """Log in as the tenant and check that its streams are there."""
        settings = BrokerSettings(
            url=self.nats_url,
            prefix=self.prefix,
            user=login.tenant,
            password=login.password,
            retry_deadline_s=1.0,
        )
        try:
            conn = await connect(settings, name="jupyterhub-probe")
            try:
                await topology.ensure_tenant(conn.js, settings, login.tenant)
            finally:
                await conn.close()
        except Exception as exc:  # recorded: "not yet", retried until the deadline, then logged
            # A refused login is the server not having reloaded the tenants file yet.
            raise TransientError(f"{type(exc).__name__}: {exc}") from exc
