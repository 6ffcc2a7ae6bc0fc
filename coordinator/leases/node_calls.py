"""Lease requests to the nodes: one node's decoded reply (None if it failed), many at once.

Every lease operation is a request-reply on the node's lease subject for the tenant
(`acquire`, `renew`, `release`). A reply that does not come, a node's refusal or a reply not
understood is logged and left to the next round, not raised; a permission error or a bug is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import attrs

from vramfabric.broker.codec import decode, encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import InvalidMessage, RemoteError, TransientError
from vramfabric.broker.settings import BrokerSettings

log = logging.getLogger(__name__)

# Renew/release requests in flight at once over all nodes, and to any one node. A node serves
# one tenant's requests one at a time (and refuses more than a few dozen queued as busy), so
# a second batch in flight to it would only wait in its queue while its request timeout runs.
_MAX_IN_FLIGHT = 16
_MAX_IN_FLIGHT_PER_NODE = 1


@attrs.frozen
class NodeLine:
    """Where lease requests go: a tenant's connection and subjects."""

    conn: Connection
    broker: BrokerSettings
    tenant: str


async def call_nodes(
    line: NodeLine, op: str, requests: Sequence[tuple[str, object]], reply_type: type
) -> list[object]:
    """Send every (node, request) with bounded concurrency; replies in the order given."""
    gate = asyncio.Semaphore(_MAX_IN_FLIGHT)
    node_gates = {node: asyncio.Semaphore(_MAX_IN_FLIGHT_PER_NODE) for node, _ in requests}

    async def one(node: str, req: object) -> object:
        # The node's gate first, so a batch queued behind its node holds no global slot.
        async with node_gates[node], gate:
            return await call_node(line, node, op, req, reply_type)

    return await asyncio.gather(*(one(node, req) for node, req in requests))


async def call_node(line: NodeLine, node: str, op: str, req: object, reply_type: type) -> object:
    """The node's decoded reply, or None (logged) if it failed or refused.

    Transient failures are retried within one request timeout (a node that has just
    started can be briefly unknown to the server); a node that stays silent is left to
    the next round. A permission error or a bug surfaces.
    """
    broker = line.broker
    subject = broker.subjects.lease(line.tenant, node, op)
    data = encode(req)

    async def ask() -> object:
        reply = await line.conn.nc.request(subject, data, timeout=broker.request_timeout_s)
        return decode(reply_type, reply.data)

    policy = broker.call_retry.within(broker.request_timeout_s)
    try:
        return await policy.call(ask, what=f"lease {op} node={node}")
    except (TransientError, RemoteError, InvalidMessage) as exc:
        log.warning("lease %s failed node=%s error=%s", op, node, exc)
    return None
