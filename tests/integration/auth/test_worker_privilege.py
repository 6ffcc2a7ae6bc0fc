"""Auth on: the workers' user may store outputs but neither purge a tenant's store nor lease."""

from __future__ import annotations

from typing import Any

from tests.authsetup import PROMPT_S, AuthFabric, refused
from tests.helpers import eventually
from vramfabric.broker.codec import encode
from vramfabric.broker.messages import ReleaseRequest
from vramfabric.broker.objects import write_object


async def test_the_workers_user_can_neither_purge_outputs_nor_lease_as_a_tenant(
    auth_fabric: AuthFabric, connections: Any, agents: Any, fabrics: Any
) -> None:
    # Given a node serving leases, and a connection as the workers' user
    await agents("n-priv")
    alice = await fabrics("alice")
    await eventually(lambda: "n-priv" in alice.fleet.adverts)
    s = auth_fabric.base.subjects
    store = s.outputs_store("alice")
    w = await connections(auth_fabric.worker)
    # When it purges alice's outputs store (through what her account exports to workers)
    # Then the server refuses it at once
    assert await refused(w.tenant_js("alice").purge_stream(s.object_stream(store))) < PROMPT_S
    # And a lease request in alice's name (as a requester) is refused at once too
    body = encode(ReleaseRequest(lease_ids=()))
    for op in ("acquire", "renew", "release", "held"):
        lease = s.lease("alice", "n-priv", op)
        assert await refused(w.nc.request(lease, body, timeout=5.0)) < PROMPT_S
    # And it still stores an output, replacing an earlier one (a chunk run again)
    await write_object(w.tenant_js("alice"), store, "priv.0", b"first" * 100, chunk_bytes=256)
    await write_object(w.tenant_js("alice"), store, "priv.0", b"second" * 100, chunk_bytes=256)
    op_conn = await connections(auth_fabric.operator_of("alice"))
    got = await (await op_conn.js.object_store(store)).get("priv.0")
    assert got.data == b"second" * 100
