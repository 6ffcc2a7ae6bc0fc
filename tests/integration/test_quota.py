"""Strict quotas: a tenant asking every node at once never holds more than its quota."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory
from vramfabric.broker import BrokerSettings, Connection, buckets, decode, encode, tenants
from vramfabric.broker.messages import (
    LeaseGrant,
    LeaseRequest,
    NodeAdvert,
    QuotaReservations,
    ReleaseReply,
    ReleaseRequest,
    RenewReply,
    RenewRequest,
)
from vramfabric.worker import Agent

GIB = 2**30
QUOTA_SLICES = 6


@pytest.fixture
def policy_file(tmp_path: Path) -> str:
    """A workers' policy: alice may hold 6 GiB fleet-wide, bob is unlimited."""
    policy = tenants.TenantPolicy(
        {
            "alice": tenants.TenantRules("alice", quota_bytes=QUOTA_SLICES * GIB),
            "bob": tenants.TenantRules("bob"),
        }
    )
    return str(tenants.write_policy(policy, tmp_path / "policy.toml"))


async def nodes(agent_factory: AgentFactory, policy_file: str, n: int) -> list[Agent]:
    """`n` nodes of 8 one-GiB slices each, under the policy."""
    return list(
        await asyncio.gather(
            *(agent_factory(f"q{i}", simulate="1x8GiB", tenants_file=policy_file) for i in range(n))
        )
    )


async def acquire(
    conn: Connection,
    broker: BrokerSettings,
    node: str,
    count: int,
    request_id: str,
    tenant: str = "alice",
    ttl_s: float = 30.0,
) -> LeaseGrant:
    """One acquire request straight to a node."""
    req = LeaseRequest(request_id=request_id, job="j1", count=count, slice_bytes=GIB, ttl_s=ttl_s)
    reply = await conn.nc.request(
        broker.subjects.lease(tenant, node, "acquire"), encode(req), timeout=5
    )
    return decode(LeaseGrant, reply.data)


async def release(
    conn: Connection, broker: BrokerSettings, node: str, ids: tuple[str, ...]
) -> tuple[str, ...]:
    """Release alice's leases `ids` on one node; the ids it says it released."""
    reply = await conn.nc.request(
        broker.subjects.lease("alice", node, "release"),
        encode(ReleaseRequest(lease_ids=ids)),
        timeout=5,
    )
    return tuple(decode(ReleaseReply, reply.data).released)


def held(agents: list[Agent], tenant: str = "alice") -> int:
    """Slices the tenant holds over the fleet, from the nodes' ledgers."""
    return sum(1 for a in agents for lease in a.ledger.holding() if lease.tenant == tenant)


async def advertised(conn: Connection, broker: BrokerSettings, tenant: str = "alice") -> int:
    """Slices the tenant holds over the fleet, as the nodes' adverts in KV say."""
    kv = await buckets.nodes_bucket(conn.js, broker)
    keys = await buckets.kv_keys(conn.js, broker, broker.subjects.nodes_bucket())
    adverts = [decode(NodeAdvert, (await kv.get(k)).value or b"") for k in keys]
    return sum(a.tenants.get(tenant, 0) for a in adverts) // GIB


async def test_a_tenant_asking_every_node_at_once_never_exceeds_its_quota(
    conn: Connection, broker: BrokerSettings, agent_factory: AgentFactory, policy_file: str
) -> None:
    # Given four nodes of 8 slices, each of which alone could grant alice more than her quota
    agents = await nodes(agent_factory, policy_file, 4)
    # When alice asks every node for 8 slices at once, three requests per node (three
    # coordinators racing), then once more after that
    waves = [
        acquire(conn, broker, a.settings.node, 8, f"r{w}{a.settings.node}")
        for w in range(3)
        for a in agents
    ]
    grants = await asyncio.gather(*waves)
    again = await asyncio.gather(
        *(acquire(conn, broker, a.settings.node, 8, f"x{a.settings.node}") for a in agents)
    )
    # Then the nodes granted exactly her quota over the fleet: 0 slices of overshoot
    assert sum(len(g.leases) for g in grants) == QUOTA_SLICES
    assert held(agents) == QUOTA_SLICES
    assert all(not g.leases and g.denied == "quota" for g in again)

    # And the adverts, once they follow, show the same
    async def adverts_follow() -> bool:
        return await advertised(conn, broker) == QUOTA_SLICES

    await eventually(adverts_follow)
    # And a tenant without a quota is not held back by alice's
    bob = await acquire(conn, broker, agents[0].settings.node, 1, "b1", tenant="bob")
    assert len(bob.leases) == 1


async def test_a_released_lease_gives_its_room_to_another_node(
    conn: Connection, broker: BrokerSettings, agent_factory: AgentFactory, policy_file: str
) -> None:
    # Given alice holding her whole quota on one node, so another node denies her
    first, second = await nodes(agent_factory, policy_file, 2)
    grant = await acquire(conn, broker, first.settings.node, QUOTA_SLICES, "r1")
    assert len(grant.leases) == QUOTA_SLICES
    assert (await acquire(conn, broker, second.settings.node, 1, "r2")).denied == "quota"
    # When she releases two of them
    ids = tuple(lease.lease_id for lease in grant.leases[:2])
    assert await release(conn, broker, first.settings.node, ids) == ids
    # Then the other node grants exactly those two at once, and no more
    more = await acquire(conn, broker, second.settings.node, 8, "r3")
    assert len(more.leases) == 2
    assert held([first, second]) == QUOTA_SLICES


async def test_a_released_lease_whose_work_still_runs_counts_against_the_quota(
    conn: Connection, broker: BrokerSettings, agent_factory: AgentFactory, policy_file: str
) -> None:
    # Given alice holding her whole quota on one node, a chunk still running on one lease
    # (its slot marked busy, as the chunk runner marks it while the work runs)
    first, second = await nodes(agent_factory, policy_file, 2)
    grant = await acquire(conn, broker, first.settings.node, QUOTA_SLICES, "r1")
    assert len(grant.leases) == QUOTA_SLICES
    busy = grant.leases[0].lease_id
    first.ledger.occupy(busy)
    # When she releases all of them
    ids = tuple(lease.lease_id for lease in grant.leases)
    assert await release(conn, broker, first.settings.node, ids) == ids
    # Then the slice whose work still runs is still hers: the other node grants one less
    # than her quota, and the first node's VRAM shows it held
    more = await acquire(conn, broker, second.settings.node, 8, "r2")
    assert len(more.leases) == QUOTA_SLICES - 1
    assert held([first, second]) == QUOTA_SLICES
    assert first.ledger.leased_bytes == GIB
    # And once the work stopped, the slice is free on its node
    first.ledger.vacate(busy)
    assert first.ledger.leased_bytes == 0


async def test_an_expired_lease_gives_its_room_back(
    conn: Connection, broker: BrokerSettings, agent_factory: AgentFactory, policy_file: str
) -> None:
    # Given alice holding her whole quota on one node with leases of one second
    first, second = await nodes(agent_factory, policy_file, 2)
    grant = await acquire(conn, broker, first.settings.node, QUOTA_SLICES, "r1", ttl_s=1.0)
    assert len(grant.leases) == QUOTA_SLICES
    assert (await acquire(conn, broker, second.settings.node, 8, "r2")).denied == "quota"
    # When they expire unrenewed, Then the other node grants the whole quota again
    granted: list[int] = []

    async def regranted() -> bool:
        reply = await acquire(conn, broker, second.settings.node, 8, f"e{len(granted)}")
        granted.append(len(reply.leases))
        return bool(reply.leases)

    await eventually(regranted, timeout_s=10.0, interval_s=0.2)
    assert granted[-1] == QUOTA_SLICES
    assert held([first, second]) == QUOTA_SLICES


async def test_a_crashed_nodes_reservation_lapses_by_itself(
    conn: Connection, broker: BrokerSettings, agent_factory: AgentFactory, policy_file: str
) -> None:
    # Given alice holding her whole quota on a node with leases of two seconds
    first, second = await nodes(agent_factory, policy_file, 2)
    grant = await acquire(conn, broker, first.settings.node, QUOTA_SLICES, "r1", ttl_s=2.0)
    assert len(grant.leases) == QUOTA_SLICES
    # When that node goes away without writing to the quota bucket (stopping drops its
    # leases locally only, as a crash does)
    await first.stop(grace_s=0.1)
    await first.conn.close()  # the fixture stops only agents still connected
    t_stopped = time.time()
    denied = await acquire(conn, broker, second.settings.node, 8, "r2")
    # Then its reservation still counts until its leases would have expired
    if time.time() < grant.leases[0].expires_at:
        assert denied.denied == "quota"

    # And then it lapses: the other node grants the whole quota
    async def regranted() -> bool:
        reply = await acquire(conn, broker, second.settings.node, 8, f"c{time.monotonic_ns()}")
        return len(reply.leases) == QUOTA_SLICES

    await eventually(regranted, timeout_s=10.0, interval_s=0.2)
    assert time.time() - t_stopped < 10.0


async def test_renewal_extends_the_reservation_before_the_leases(
    conn: Connection, broker: BrokerSettings, agent_factory: AgentFactory, policy_file: str
) -> None:
    # Given alice holding three slices on a node, leased for two seconds
    (node,) = await nodes(agent_factory, policy_file, 1)
    grant = await acquire(conn, broker, node.settings.node, 3, "r1", ttl_s=2.0)
    ids = tuple(lease.lease_id for lease in grant.leases)
    # When she renews them for 30 seconds
    renewed_at = time.time()
    reply = await conn.nc.request(
        broker.subjects.lease("alice", node.settings.node, "renew"),
        encode(RenewRequest(lease_ids=ids, ttl_s=30.0)),
        timeout=5,
    )
    renew = decode(RenewReply, reply.data)
    # Then the leases are renewed, and her reservation in KV covers them for as long
    assert set(renew.expires_at) == set(ids) and not renew.revoked
    kv = await buckets.quota_bucket(conn.js, broker)
    book = decode(QuotaReservations, (await kv.get("alice")).value or b"")
    mine = book.nodes[node.settings.node]
    assert mine.reserved_bytes == 3 * GIB
    assert mine.until >= renewed_at + 30.0 >= max(renew.expires_at.values()) - 1.0
