"""Interactive calls with auth on: through the tenant's one import, on its own leases only."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import pytest

from tests.authsetup import PROMPT_S, AuthFabric, refused
from tests.integration.auth.test_hostile import direct_get_to
from vramfabric.broker.calls import MAX_CALL_INPUT_BYTES, CallReply, CallRequest
from vramfabric.broker.codec import decode, encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import CodeRefused, ErrorKind
from vramfabric.kernels.code import MAX_BLOB_BYTES, encode_input, python_version
from vramfabric.worker import Agent


def whoami() -> int:
    return os.getpid()


async def test_a_tenant_calls_its_own_slice_and_nobody_else_can(
    auth_fabric: AuthFabric, connections: Any, agents: Any, fabrics: Any
) -> None:
    # Given a node that runs code, and alice (who may run code) in a block on it
    s = auth_fabric.base.subjects
    agent: Agent = await agents("n-calls", simulate="1x4GiB", allow_code=True)
    alice = await fabrics("alice")
    b = await connections(auth_fabric.tenant("bob"))
    async with alice.gpu() as gpu:
        pid = await gpu.run(whoami)
        assert pid != os.getpid()  # it ran in an executor process, not here
        lease = gpu.pool.leases[next(iter(gpu.pool.leases))]
        work = gpu.work
        ask = CallRequest(
            lease.lease_id, "whoami", work.digest, python_version(), encode_input(None), 10.0
        )
        # When bob sends a call naming alice's lease on his own subject (the one he may use)
        reply = decode(
            CallReply, (await b.nc.request(s.call("bob", lease.node), encode(ask), timeout=5)).data
        )
        # Then the node refuses it: the lease is not his
        assert not reply.ok and reply.error_kind is ErrorKind.LEASE_EXPIRED
        # And when he sends it on alice's subject, directly or through the server
        subject = s.call("alice", lease.node)
        assert await refused(b.nc.request(subject, encode(ask), timeout=PROMPT_S * 2)) < PROMPT_S
        await direct_get_to(b.nc, s, "bob", encode(ask), subject)
        # Then nothing of it ran there, and alice's slice still serves her
        assert not agent.ledger.is_busy(lease.lease_id)
        assert await gpu.run(whoami) == pid
    assert "alice" not in agent.ledger.advert(0).tenants


async def test_a_tenant_without_code_rights_is_refused_on_its_own_lease(
    auth_fabric: AuthFabric, agents: Any, fabrics: Any
) -> None:
    # Given a node that runs code, and bob, whom the tenants file does not allow code
    agent: Agent = await agents("n-nocode", simulate="1x4GiB", allow_code=True)
    bob = await fabrics("bob")
    # When bob runs a call in a block, then it is refused naming the tenants file
    with pytest.raises(CodeRefused, match="tenants file"):
        async with bob.gpu() as gpu:
            await gpu.run(whoami)
    # And his slice went back
    assert "bob" not in agent.ledger.advert(0).tenants


def twice(x: int) -> int:
    return 2 * x


async def test_a_tenant_maps_and_breaks_off_leaving_nothing(
    auth_fabric: AuthFabric, connections: Any, agents: Any, fabrics: Any
) -> None:
    # Given alice on a node that runs code, with auth on
    s = auth_fabric.base.subjects
    agent: Agent = await agents("n-map", simulate="1x4GiB", allow_code=True)
    alice = await fabrics("alice")
    # When she maps over an endless generator and breaks off after 5 results
    results = alice.map(twice, iter(range(10**9)), slices=2)
    taken = []
    async for x in results:
        taken.append(x)
        if len(taken) == 5:
            break
    await results.aclose()
    # Then her leases are gone and her work stream holds no chunk and no consumer
    assert len(taken) == 5 and len(agent.ledger) == 0
    op = await connections(auth_fabric.operator_of("alice"))
    info = await op.js.stream_info(s.work_stream("alice"))
    assert info.state.messages == 0 and info.state.consumer_count == 0


# Module data a function reads: pickled with the function (by value), past a message's size.
TABLE = bytes(range(256)) * (3 * 2**20 // 256)


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_of_table() -> str:
    return hashlib.sha256(TABLE).hexdigest()


# A refusal from the meta alone comes well before the 30 s a read of an absent object (or of
# chunks that never come) retries for.
UNREAD_S = 3 * PROMPT_S


async def fake_object(conn: Connection, tenant: str, name: str, size: int) -> None:
    """A meta in the tenant's kernels store saying object `name` is `size` bytes (no chunks)."""
    s = conn.settings.subjects
    bucket = s.kernels_store(tenant)
    meta = {"name": name, "bucket": bucket, "nuid": "n0", "size": size, "chunks": 10**4}
    await conn.js.publish(s.object_meta(bucket, name), json.dumps(meta).encode())


async def kernels_messages(conn: Connection, tenant: str) -> int:
    """Messages in the tenant's kernels store: chunks and metas, delete markers included."""
    s = conn.settings.subjects
    info = await conn.js.stream_info(s.object_stream(s.kernels_store(tenant)))
    return int(info.state.messages)


async def test_a_call_carries_arguments_larger_than_a_message_and_leaves_nothing_stored(
    auth_fabric: AuthFabric, connections: Any, agents: Any, fabrics: Any
) -> None:
    # Given alice in a block on a node that runs code, with auth on
    await agents("n-large-in", simulate="1x4GiB", allow_code=True)
    alice = await fabrics("alice")
    op = await connections(auth_fabric.operator_of("alice"))
    data = os.urandom(5 * 2**20)  # five times what a message carries
    async with alice.gpu() as gpu:
        await gpu.run(digest_of, b"")  # the call's work is uploaded: the store as it stays
        before = await kernels_messages(op, "alice")
        # When a call takes 5 MiB of arguments, and another reads 3 MiB of module data
        assert await gpu.run(digest_of, data) == digest_of(data)
        assert await gpu.run(digest_of_table) == digest_of(TABLE)
        # Then both ran on the slice with what was sent, and small calls still go as before
        assert await gpu.run(digest_of, b"x") == digest_of(b"x")
        # And no input is left in her store once the calls returned, not even a marker
        assert await kernels_messages(op, "alice") == before


@pytest.mark.parametrize(
    ("named", "kind", "limit"),
    [
        ("input", ErrorKind.INVALID_MESSAGE, MAX_CALL_INPUT_BYTES),
        ("work", ErrorKind.LOAD_FAILED, MAX_BLOB_BYTES),
    ],
)
async def test_a_call_naming_an_object_past_its_limit_is_refused_unread(
    auth_fabric: AuthFabric, agents: Any, fabrics: Any, named: str, kind: ErrorKind, limit: int
) -> None:
    # Given alice in a block, and an object in her kernels store whose meta says 10 GiB
    s = auth_fabric.base.subjects
    agent: Agent = await agents(f"n-huge-{named}", simulate="1x4GiB", allow_code=True)
    alice = await fabrics("alice")
    name = s.call_input_object("huge") if named == "input" else "ab" * 32
    await fake_object(alice.conn, "alice", name, 10 * 2**30)
    async with alice.gpu() as gpu:
        lease = gpu.pool.leases[next(iter(gpu.pool.leases))]
        # When she sends a call naming it as its input, or as its work (code by digest)
        if named == "input":
            ask = CallRequest(
                lease.lease_id, "f", gpu.work.digest, python_version(), b"", 10.0, input_ref=name
            )
        else:
            ask = CallRequest(lease.lease_id, "f", name, python_version(), encode_input(0), 10.0)
        t0 = time.monotonic()
        msg = await alice.conn.nc.request(s.call("alice", lease.node), encode(ask), timeout=10)
        reply = decode(CallReply, msg.data)
        # Then the node refuses it at once from the meta, instead of reading 10 GiB into memory
        assert not reply.ok and reply.error_kind is kind
        assert f"at most {limit}" in (reply.error or "")
        assert time.monotonic() - t0 < UNREAD_S
        # And the node and her slice go on serving her
        assert not agent.ledger.is_busy(lease.lease_id)
        assert await gpu.run(digest_of, b"y") == digest_of(b"y")
