"""nats-server configuration from a tenants file: one NATS account per tenant, and FABRIC.

Permissions never cover the reply subject of a request, and whatever answers a request (the
JetStream API, a direct get, a node's lease service) publishes where the asker says, with
its own rights (NATS_GUIDE.md section 12). So within one account any user reaches every
subject of it. Each tenant therefore gets an account of its own: its streams, buckets,
stores, inboxes and JetStream API live there, and what crosses to the fabric's account
(workers, operator, adverts, lease services) is only what the narrow imports and exports
in accounts.py name. Inside its account a tenant's user is still held to its own subjects and
streams (it may not create or delete streams: the operator provisions them).

The users' allow-lists are built in permissions.py, the accounts block in accounts.py; here
the whole config, writing it, and provisioning the accounts' streams.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path

import attrs

from . import topology
from .accounts import FABRIC_ACCOUNT, accounts, operator_user, tenant_account
from .connection import connect
from .server import host_port
from .settings import BrokerSettings
from .subjects import Subjects
from .tenants import TenantsFile
from .tls import ServerTls

# What callers reach as `auth.<name>` (tests, the local fabric, the usage report).
__all__ = [
    "FABRIC_ACCOUNT",
    "accounts",
    "operator_user",
    "provision_tenants",
    "server_config",
    "settings_for",
    "tenant_account",
    "write_config",
    "write_private",
]

# nats-server's own default JetStream memory total: this share of the host's memory.
_HOST_SHARE = 0.75
# Memory beyond the tenants' limits in an overcommitted total: the fabric's own account.
_FABRIC_ROOM_BYTES = 2**30


def server_config(
    tenants: TenantsFile,
    subjects: Subjects,
    *,
    host: str = "127.0.0.1",
    port: int = 4222,
    tls: ServerTls | None = None,
) -> str:
    """The nats-server config text: JetStream on, one account per tenant and the fabric's.

    The operator has no permission limits. The config is JSON, which nats-server's
    config parser reads as it is (no escaping rules of our own to get wrong).
    """
    config = {
        "listen": host_port(host, port),  # an IPv6 address in brackets
        "jetstream": _jetstream(tenants),
        "accounts": accounts(tenants, subjects),
    }
    if tls is not None:  # clients must use TLS: their passwords never cross in clear
        config["tls"] = tls.client_block()
    return json.dumps(config, indent=2)


def _jetstream(tenants: TenantsFile) -> dict[str, object]:
    """The server's `jetstream` block: totals with room for every tenant account's limits.

    nats-server reserves each account's `max_mem` out of its own total (by default 75% of
    the host's memory) and will not start where they do not fit: 500 tenants at the default
    256 MiB are 125 GiB. Where they would not fit, the total is set to their sum plus the
    fabric's room: each tenant stays bound by its limit, but together they are promised
    more memory than the host holds (docs/operations/tenants.md, Account limits).
    """
    reserved = sum(max(t.limits.memory_storage_bytes, 0) for t in tenants.tenants)
    host_bytes = int(_HOST_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    if reserved + _FABRIC_ROOM_BYTES <= host_bytes:
        return {}
    return {"max_memory_store": reserved + _FABRIC_ROOM_BYTES}


def write_config(
    tenants: TenantsFile, subjects: Subjects, path: str | Path, *, port: int = 4222
) -> Path:
    """Write the server config where only its owner can read it (it may hold passwords)."""
    return write_private(path, server_config(tenants, subjects, port=port))


def write_private(path: str | Path, text: str) -> Path:
    """Write `text` to a file only its owner can read, even if it existed with a wider mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(fd, 0o600)  # O_CREAT's mode applies to a new file only
        out.write(text)
    return Path(path)


def settings_for(base: BrokerSettings, user: str, password: str | None) -> BrokerSettings:
    """`base` connecting as `user` (tests and the local fabric; a deployment uses the env)."""
    return attrs.evolve(base, user=user, password=password, creds_file=None, nkey_seed_file=None)


async def provision_tenants(
    operator: BrokerSettings, tenants: TenantsFile, only: Collection[str] | None = None
) -> None:
    """As the operator, create the fabric's buckets, then each tenant's streams and stores.

    Each tenant's are made in its own account, logged in as the operator's user there;
    `only` names the tenants to provision (None: all), such as those just added.
    """
    conn = await connect(operator, name="provision")
    try:
        await topology.provision_fabric(conn.js, operator)
    finally:
        await conn.close()
    for tenant in tenants.tenants:
        if only is not None and tenant.name not in only:
            continue
        inside = settings_for(operator, operator_user(tenant.name), operator.password)
        conn = await connect(inside, name="provision")
        try:
            await topology.provision_tenant(conn.js, inside, tenant.name)
        finally:
            await conn.close()
