"""Lease service against a real server: expiry, capacity denials, hostile payloads, batching."""

from __future__ import annotations

import msgpack
import pytest

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from tests.kernels_for_tests import SLEEPY, sleepy_input
from vramfabric.broker import (
    BrokerSettings,
    Connection,
    ErrorKind,
    LeaseGrant,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
    RemoteError,
    buckets,
    decode,
    encode,
)
from vramfabric.broker.errors import JobTimeout
from vramfabric.broker.messages import NodeAdvert
from vramfabric.coordinator import ArgMin, Job
from vramfabric.coordinator.leases.leasing import LeasePool

GIB = 2**30
MIB = 2**20


async def request_leases(
    conn: Connection,
    broker: BrokerSettings,
    node: str,
    count: int,
    ttl_s: float = 30.0,
    request_id: str = "r1",
) -> LeaseGrant:
    """Send one acquire request straight to a node."""
    req = LeaseRequest(request_id=request_id, job="j1", count=count, slice_bytes=GIB, ttl_s=ttl_s)
    reply = await conn.nc.request(
        broker.subjects.lease("default", node, "acquire"), encode(req), timeout=2
    )
    return decode(LeaseGrant, reply.data)


async def advert_of(conn: Connection, broker: BrokerSettings, node: str) -> NodeAdvert:
    """The node's advert as KV holds it now."""
    kv = await buckets.nodes_bucket(conn.js, broker)
    entry = await kv.get(node)
    assert entry.value is not None
    return decode(NodeAdvert, entry.value)


async def test_unrenewed_lease_expires_and_next_advert_shows_vram_free(
    conn: Connection, broker: BrokerSettings, agent_factory: AgentFactory
) -> None:
    # Given a node with 2 GPUs of 4 GiB and a 1 s lease on one slice
    await agent_factory("n1")
    grant = await request_leases(conn, broker, "n1", count=1, ttl_s=1.0)
    assert len(grant.leases) == 1

    async def leased() -> bool:
        return sum(g.leased_bytes for g in (await advert_of(conn, broker, "n1")).gpus) == GIB

    await eventually(leased, timeout_s=5)

    # When nobody renews it
    # Then an advert after its expiry shows all VRAM free again
    async def freed() -> bool:
        a = await advert_of(conn, broker, "n1")
        return (
            a.sent_at > grant.leases[0].expires_at and sum(g.free_bytes for g in a.gpus) == 8 * GIB
        )

    await eventually(freed, timeout_s=5)
    # And a renewal of it now reports it unknown
    from vramfabric.broker import RenewReply, RenewRequest

    reply = await conn.nc.request(
        broker.subjects.lease("default", "n1", "renew"),
        encode(RenewRequest((grant.leases[0].lease_id,), 5.0)),
        timeout=2,
    )
    assert decode(RenewReply, reply.data).unknown == (grant.leases[0].lease_id,)


async def test_request_beyond_capacity_is_denied_with_a_reason(
    conn: Connection, broker: BrokerSettings, agent_factory: AgentFactory
) -> None:
    # Given a node with 8 slices of 1 GiB
    await agent_factory("n1")
    # When one request asks for 10, it gets the 8 there are
    first = await request_leases(conn, broker, "n1", count=10, request_id="a")
    assert len(first.leases) == 8 and first.denied is None
    # Then the next request is denied, saying why
    second = await request_leases(conn, broker, "n1", count=1, request_id="b")
    assert second.leases == ()
    assert second.denied is not None and "no free slice" in second.denied
    # And releasing gives the VRAM back at once
    ids = tuple(lease.lease_id for lease in first.leases)
    reply = await conn.nc.request(
        broker.subjects.lease("default", "n1", "release"), encode(ReleaseRequest(ids)), timeout=2
    )
    assert set(decode(ReleaseReply, reply.data).released) == set(ids)


async def test_same_request_id_gets_the_same_grant(
    conn: Connection, broker: BrokerSettings, agent_factory: AgentFactory
) -> None:
    # Given a grant whose reply the coordinator may have lost
    await agent_factory("n1")
    first = await request_leases(conn, broker, "n1", count=3, request_id="again")
    # When the same request is sent again
    second = await request_leases(conn, broker, "n1", count=3, request_id="again")
    # Then it is the same grant, not three more slices
    assert [x.lease_id for x in second.leases] == [x.lease_id for x in first.leases]
    advert = await advert_of(conn, broker, "n1")
    assert sum(g.leased_bytes for g in advert.gpus) <= 3 * GIB


async def test_acquisition_runs_with_fewer_leases_than_asked(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a fleet of 4 slices and a job that asks for 20
    await agent_factory("n1", simulate="1x4GiB")
    fabric = await fabric_factory()
    job = Job(SLEEPY, [sleepy_input(i) for i in range(20)])
    # When it runs
    result = await fabric.run(job, ArgMin(), slices=20, timeout_s=30)
    # Then it finished every chunk on the 4 leases it could get
    assert result.n_ok == 20
    assert result.leases_peak == 4
    assert result.value == (0, 0.0)


@pytest.mark.timeout(120)
async def test_jobs_ending_while_their_last_leases_come_leave_no_lease_behind(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
) -> None:
    # Given two nodes of 512 slices each and leases that would outlive the test (TTL 60 s)
    for node in ("n1", "n2"):
        await agent_factory(node, simulate="4x32GiB", slice_bytes=256 * MIB)
    fabric = await fabric_factory(slice_bytes=256 * MIB, lease_ttl_s=60.0)
    # When jobs of 1000 slow chunks time out at once, each while the leases after its first
    # request are still being granted (its first chunks already run)
    for _ in range(5):
        job = Job(SLEEPY, [sleepy_input(v) for v in range(1000)], args={"sleep_s": 5.0})
        with pytest.raises(JobTimeout):
            await fabric.run(job, ArgMin(), timeout_s=0.05)

    # Then within a few heartbeats (not the TTL) both nodes advertise every slice free again
    async def all_free() -> bool:
        adverts = [await advert_of(conn, broker, node) for node in ("n1", "n2")]
        return all(g.leased_bytes == 0 for a in adverts for g in a.gpus)

    # 25 s: a few heartbeats on a loaded machine, and still well short of the 60 s TTL
    await eventually(all_free, timeout_s=25)


async def test_acquire_asks_again_a_node_that_granted_its_whole_batch(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given two nodes of 8 slices each and a pool that asks for 3 leases per request
    agents = [await agent_factory(node, simulate="1x8GiB") for node in ("n1", "n2")]
    fabric = await fabric_factory(max_lease_batch=3)
    await eventually(lambda: set(fabric.fleet.adverts) == {"n1", "n2"})
    pool = LeasePool(fabric.conn, fabric.broker, fabric.settings, fabric.fleet, "batched")
    # When it wants more than one batch per node
    got = await pool.acquire(14)
    # Then it goes round until the want is met, not one batch per node
    assert got == len(pool) == 14
    assert sum(len(agent.ledger) for agent in agents) == 14
    # And when it wants more than the fleet has, it takes the rest and stops
    assert await pool.acquire(10) == 2
    assert await pool.release() == 16


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_pool_of_60000_leases_on_one_node_renews_and_releases_them_all(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given one node of 60,000 slices of 1 MiB: far more lease ids than one request may carry
    n = 60_000
    agent = await agent_factory("n1", simulate=f"1x{n}MiB", slice_bytes=MIB)
    fabric = await fabric_factory(slice_bytes=MIB, lease_ttl_s=120.0)
    await eventually(lambda: "n1" in fabric.fleet.adverts)
    pool = LeasePool(fabric.conn, fabric.broker, fabric.settings, fabric.fleet, "big")
    # When one acquire asks for all of them
    assert await pool.acquire(n) == n
    assert len(pool) == len(agent.ledger) == n
    # Then one renewal extends every lease, on the node and in the pool
    before = {i: lease.expires_at for i, lease in pool.leases.items()}
    await pool.renew()
    assert len(pool) == n
    assert all(lease.expires_at > before[i] for i, lease in pool.leases.items())
    held = {i: agent.ledger.get(i) for i in pool.leases}
    assert all(h is not None and h.expires_at == pool.leases[i].expires_at for i, h in held.items())
    # And the node advertises them all leased
    await eventually(lambda: _leased_bytes(fabric.fleet.adverts.get("n1")) == n * MIB)
    # And one release gives every one back
    assert await pool.release() == n
    assert len(pool) == 0 and len(agent.ledger) == 0
    await eventually(lambda: _leased_bytes(fabric.fleet.adverts.get("n1")) == 0)


def _leased_bytes(advert: NodeAdvert | None) -> int | None:
    """Leased bytes over all GPUs of an advert; None when there is no advert."""
    return None if advert is None else sum(g.leased_bytes for g in advert.gpus)


HOSTILE_PAYLOADS = [
    b"",
    b"\xc1\xff garbage",
    msgpack.packb([1, 2, 3]),
    msgpack.packb(
        {
            "t": "LeaseRequest",
            "v": 99,
            "request_id": "x",
            "job": "j",
            "count": 1,
            "slice_bytes": GIB,
            "ttl_s": 5.0,
        }
    ),
    msgpack.packb(
        {
            "t": "LeaseRequest",
            "v": 1,
            "request_id": "x",
            "job": "j",
            "count": "many",
            "slice_bytes": GIB,
            "ttl_s": 5.0,
        }
    ),
    msgpack.packb(
        {
            "t": "LeaseRequest",
            "v": 1,
            "request_id": "x",
            "job": "j.k",
            "count": 1,
            "slice_bytes": GIB,
            "ttl_s": 5.0,
        }
    ),
    msgpack.packb({"t": "ChunkResult", "v": 1}),
    b"\x00" * 2_000_000,
]


@pytest.mark.parametrize("op", ["acquire", "renew", "release"])
async def test_malformed_lease_requests_get_a_clear_error_and_the_node_keeps_serving(
    op: str, conn: Connection, broker: BrokerSettings, agent_factory: AgentFactory
) -> None:
    # Given a serving node
    agent = await agent_factory("n1")
    subject = broker.subjects.lease("default", "n1", op)
    for payload in HOSTILE_PAYLOADS:
        if len(payload) > conn.nc.max_payload:
            continue  # the server itself refuses it; nothing reaches the node
        # When a malformed request arrives
        reply = await conn.nc.request(subject, payload, timeout=2)
        # Then the reply is an error naming the problem
        with pytest.raises(RemoteError) as info:
            decode(LeaseGrant, reply.data)
        assert info.value.remote_kind is ErrorKind.INVALID_MESSAGE
        assert "invalid" in str(info.value)
    # And the node still grants leases and counts what it rejected
    grant = await request_leases(conn, broker, "n1", count=1)
    assert len(grant.leases) == 1
    assert agent.metrics.value("invalid_messages_total", subject=f"lease.{op}") >= 6


async def test_listing_the_nodes_bucket_finds_every_stored_key_on_every_read(
    conn: Connection, broker: BrokerSettings
) -> None:
    # Given one live advert and one deleted (a marker readers skip)
    kv = await buckets.nodes_bucket(conn.js, broker)
    await kv.put("n1", b"advert")
    await kv.put("n2", b"advert")
    await kv.delete("n2")
    # When the keys are listed again and again (nats-py's keys() lost them now and then)
    listings = [
        await buckets.kv_keys(conn.js, broker, broker.subjects.nodes_bucket()) for _ in range(100)
    ]
    # Then every listing has both subjects, and only n1 reads back a value
    assert listings == [["n1", "n2"]] * 100
    assert (await kv.get("n1")).value == b"advert"
