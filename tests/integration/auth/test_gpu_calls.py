"""Interactive calls with auth on: through the tenant's one import, on its own leases only."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.authsetup import PROMPT_S, AuthFabric, refused
from tests.integration.auth.test_hostile import direct_get_to
from vramfabric.broker.calls import CallReply, CallRequest
from vramfabric.broker.codec import decode, encode
from vramfabric.broker.errors import CodeRefused, ErrorKind
from vramfabric.kernels.code import encode_input, python_version
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
