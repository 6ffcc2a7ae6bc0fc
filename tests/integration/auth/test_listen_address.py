"""A server with auth on listens where `vramfabric server --host` says, an IPv6 address too."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import attrs
import pytest

from tests.authsetup import TENANTS_TOML
from tests.helpers import has_ipv6_loopback
from vramfabric.authserver import AuthServer
from vramfabric.broker import auth
from vramfabric.broker.connection import connect
from vramfabric.broker.errors import PermissionDenied
from vramfabric.broker.settings import BrokerSettings


@pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
async def test_an_auth_server_on_an_ipv6_address_takes_its_tenants(tmp_path: Path) -> None:
    # Given a tenants file, and a server with auth on to listen on ::1
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS_TOML)
    base = BrokerSettings(prefix=f"v{uuid.uuid4().hex[:8]}")
    # When it starts (its generated config wrote "::1:<port>" before, which nats-server
    # refused to parse: it never became ready)
    server = await asyncio.to_thread(AuthServer(path, base, "op-secret", host="::1").start)
    try:
        # Then its URL brackets the address, a tenant connects there, and auth is on
        url = server.server.url
        assert url.startswith("nats://[::1]:"), url
        on_v6 = attrs.evolve(base, url=url)
        conn = await connect(auth.settings_for(on_v6, "alice", "alice-secret"), name="alice-v6")
        try:
            await conn.nc.flush()
            assert conn.nc.connected_url is not None
            assert conn.nc.connected_url.hostname == "::1"
        finally:
            await conn.close()
        with pytest.raises(PermissionDenied):
            await connect(auth.settings_for(on_v6, "alice", "not-her-password"), name="x")
    finally:
        server.stop()
