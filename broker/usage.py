"""Each tenant's JetStream use against its account limits, as the operator sees it."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from .auth import operator_user, settings_for
from .connection import connect
from .errors import nats_errors
from .settings import BrokerSettings


@attrs.frozen
class AccountUsage:
    """One tenant account's JetStream use and limits (-1: no limit)."""

    tenant: str
    storage_bytes: int
    storage_limit_bytes: int
    memory_bytes: int
    memory_limit_bytes: int
    streams: int
    streams_limit: int
    consumers: int
    consumers_limit: int

    def line(self) -> str:
        """One line for `vramfabric status`: use / limit of each."""

        def of(used: int, limit: int, unit: float = 1.0) -> str:
            cap = "unlimited" if limit < 0 else f"{limit / unit:.0f}"
            return f"{used / unit:.1f}/{cap}" if unit != 1.0 else f"{used}/{cap}"

        mib = 2**20
        return (
            f"{self.tenant}: storage {of(self.storage_bytes, self.storage_limit_bytes, mib)} MiB"
            f", memory {of(self.memory_bytes, self.memory_limit_bytes, mib)} MiB"
            f", streams {of(self.streams, self.streams_limit)}"
            f", consumers {of(self.consumers, self.consumers_limit)}"
        )


async def account_usage(operator: BrokerSettings, tenants: Iterable[str]) -> list[AccountUsage]:
    """Ask each tenant's account (as the operator's user in it) for its use and limits."""
    out = []
    for tenant in tenants:
        inside = settings_for(operator, operator_user(tenant), operator.password)
        conn = await connect(inside, name="usage")
        try:
            with nats_errors():
                info = await conn.js.account_info()
        finally:
            await conn.close()
        out.append(
            AccountUsage(
                tenant=tenant,
                storage_bytes=info.storage,
                storage_limit_bytes=info.limits.max_storage,
                memory_bytes=info.memory,
                memory_limit_bytes=info.limits.max_memory,
                streams=info.streams,
                streams_limit=info.limits.max_streams,
                consumers=info.consumers,
                consumers_limit=info.limits.max_consumers,
            )
        )
    return out
