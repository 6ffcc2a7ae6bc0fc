"""A coordinator's own tenant, checked at connect: a login of another tenant says so plainly.

With auth on, a tenant's user may act only as that tenant. A client whose
`VRAMFABRIC_TENANT` is not its login's (most often unset, so `default`) is refused its first
call on the tenant's streams; the server's words for it name a JetStream subject
(`$js.api.stream.info.vf_work_default`), not the setting to fix.
"""

from __future__ import annotations

import contextlib

from vramfabric.broker import buckets, topology
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import PermissionDenied
from vramfabric.broker.settings import BrokerSettings


async def ensure_own_tenant(conn: Connection, broker: BrokerSettings, tenant: str) -> None:
    """Check (or create) the tenant's streams and the jobs bucket; a refusal names the login.

    Raises:
        PermissionDenied: the server refused this login the tenant's streams; when the
            login is another tenant's user, the message says which tenant to set.
    """
    try:
        await topology.ensure_tenant(conn.js, broker, tenant)
    except PermissionDenied as exc:
        raise PermissionDenied(tenant_refused(broker, tenant, str(exc))) from exc
    # The shared jobs bucket, once per connection (a job's spec goes in it: put_jobs_key).
    with contextlib.suppress(PermissionDenied):
        # With auth on, the operator made the bucket and a tenant may not even look at it.
        await buckets.jobs_bucket(conn.js, broker)


def tenant_refused(broker: BrokerSettings, tenant: str, why: str) -> str:
    """The plain words for a login refused the streams of `tenant`."""
    user = broker.user
    if user and broker.in_tenant_account and user != tenant:
        return (
            f"tenant {tenant!r} is not this login's: it logged in as {user!r}, a tenant's "
            f"own user, which acts only as tenant {user!r}; set VRAMFABRIC_TENANT={user} "
            f"(unset, the tenant is 'default') ({why})"
        )
    who = user or broker.creds_file or broker.nkey_seed_file or "an anonymous login"
    return (
        f"this login ({who}) may not use tenant {tenant!r}: is VRAMFABRIC_TENANT the "
        f"tenant of VRAMFABRIC_NATS_USER? ({why})"
    )
