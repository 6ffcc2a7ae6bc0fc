"""A hostile tenant with a raw NATS client and its own password, against auth on.

NATS checks what a client publishes to, never the reply subject it sets, and whatever answers
(the JetStream API, a direct get, a node's lease service) publishes there (NATS_GUIDE.md
section 12). Each test first shows the trick working inside the attacker's own account (so
the server really answered), then that nothing of another tenant's, or of the fabric's,
changed.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from nats.aio.client import Client

from tests.authsetup import PROMPT_S, AuthFabric, refused
from tests.helpers import eventually
from vramfabric.broker.codec import encode
from vramfabric.broker.connection import Connection
from vramfabric.broker.messages import LeaseRequest
from vramfabric.broker.subjects import Subjects
from vramfabric.worker import Agent


async def direct_get_to(
    nc: Client, s: Subjects, tenant: str, payload: bytes, target: str, **headers: str
) -> None:
    """Have the server publish `payload` on `target` (a direct get of the tenant's own key).

    The trick that made JetStream run any request a tenant chose, when all shared an account.
    """
    key = f"evil{uuid.uuid4().hex[:8]}"
    subject = s.kv_subject(s.jobs_bucket(), s.job_key(tenant, key))
    await nc.request(subject, payload, timeout=PROMPT_S, headers=headers or None)
    get = f"$JS.API.DIRECT.GET.{s.kv_stream(s.jobs_bucket())}.{subject}"
    await nc.publish(get, b"", reply=target)
    await nc.flush()


async def sides(auth_fabric: AuthFabric, connections: Any) -> tuple[Connection, ...]:
    """Connections of (alice, bob, alice's operator, bob's operator).

    Alice is the victim, bob the attacker with his own password; each operator sees one account.
    """
    users = (
        auth_fabric.tenant("alice"),
        auth_fabric.tenant("bob"),
        auth_fabric.operator_of("alice"),
        auth_fabric.operator_of("bob"),
    )
    return tuple([await connections(user) for user in users])


async def results_of(op: Connection, s: Subjects, tenant: str) -> int:
    """Messages in the tenant's results stream, as the operator sees them in its account."""
    return (await op.js.stream_info(s.results_stream(tenant))).state.messages


async def test_js_api_answers_aimed_at_another_tenant_land_nowhere(
    auth_fabric: AuthFabric, connections: Any
) -> None:
    # Given alice's results stream holding one result, and bob with his own password
    s = auth_fabric.base.subjects
    a, b, a_op, b_op = await sides(auth_fabric, connections)
    job = uuid.uuid4().hex[:12]
    await a.js.publish(s.result("alice", job, 1), b"alice's result")
    before_a, before_b = await results_of(a_op, s, "alice"), await results_of(b_op, s, "bob")
    # When bob makes allowed JetStream calls with their answers aimed at alice's result
    # subjects, and (the control) at his own
    for target in (s.result("alice", job, 0), s.result("bob", job, 0)):
        await b.nc.publish(s.stream_info_api(s.work_stream("bob")), b"", reply=target)
        await b.nc.publish("$JS.API.STREAM.NAMES", b"", reply=target.replace(".0", ".2"))
    await b.nc.flush()
    # Then the control shows the server answered (his own results stream took both answers)
    await eventually(lambda: has_results(b_op, s, "bob", before_b + 2))
    # And alice's results are as they were: nothing landed, no chunk of hers spoiled
    assert await results_of(a_op, s, "alice") == before_a
    info = await a_op.js.stream_info(
        s.results_stream("alice"), subjects_filter=s.result_filter("alice", job)
    )
    assert set(info.state.subjects or {}) == {s.result("alice", job, 1)}


async def has_results(op: Connection, s: Subjects, tenant: str, want: int) -> bool:
    """Poll helper: whether the tenant's results stream holds `want` messages."""
    return await results_of(op, s, tenant) == want


async def test_direct_gets_aimed_at_the_jetstream_api_cannot_touch_another_tenant(
    auth_fabric: AuthFabric, connections: Any
) -> None:
    # Given alice's streams, one result in them, and bob who may write and read his own key
    s = auth_fabric.base.subjects
    a, b, a_op, b_op = await sides(auth_fabric, connections)
    job = uuid.uuid4().hex[:12]
    await a.js.publish(s.result("alice", job, 0), b"alice's result")
    await b.js.publish(s.result("bob", job, 0), b"bob's result")
    config = (await a_op.js.stream_info(s.results_stream("alice"))).config
    before = await results_of(a_op, s, "alice")
    # When bob has the server publish requests of his choosing on the JetStream API:
    # delete, purge and reconfigure alice's streams, and (the control) purge his own
    api = "$JS.API"
    evil = json.dumps({"name": s.results_stream("alice"), "subjects": ["x.>"]}).encode()
    for target in (
        f"{api}.STREAM.DELETE.{s.results_stream('alice')}",
        f"{api}.STREAM.DELETE.{s.work_stream('alice')}",
        f"{api}.STREAM.PURGE.{s.results_stream('alice')}",
    ):
        await direct_get_to(b.nc, s, "bob", b"{}", target)
    await direct_get_to(b.nc, s, "bob", evil, f"{api}.STREAM.UPDATE.{s.results_stream('alice')}")
    await direct_get_to(b.nc, s, "bob", b"{}", f"{api}.STREAM.PURGE.{s.results_stream('bob')}")
    # Then the control shows JetStream ran it (bob's own results stream is empty now)
    await eventually(lambda: has_results(b_op, s, "bob", 0))
    # And alice's streams all exist, unchanged, her result still there
    assert await results_of(a_op, s, "alice") == before
    assert (await a_op.js.stream_info(s.results_stream("alice"))).config == config
    await a_op.js.stream_info(s.work_stream("alice"))


async def test_leases_only_as_oneself_and_only_for_a_known_tenant(
    auth_fabric: AuthFabric, connections: Any, agents: Any
) -> None:
    # Given a node serving leases
    s = auth_fabric.base.subjects
    agent: Agent = await agents("n-hostile", simulate="1x4GiB")
    b = await connections(auth_fabric.tenant("bob"))
    node = agent.settings.node
    ask = LeaseRequest(uuid.uuid4().hex[:12], "job", 4, 2**30, 3600.0)
    # When bob asks for leases as alice, or as a tenant nobody made, directly
    for tenant in ("alice", "mallory"):
        subject = s.lease(tenant, node, "acquire")
        assert await refused(b.nc.request(subject, encode(ask), timeout=PROMPT_S * 2)) < PROMPT_S
        # or by having the server publish his request there
        await direct_get_to(b.nc, s, "bob", encode(ask), subject)
    # And when the fabric's own operator asks for a tenant that is not in the tenants file
    op = await connections(auth_fabric.operator)
    reply = await op.nc.request(s.lease("mallory", node, "acquire"), encode(ask), timeout=5)
    # Then that request is refused with a clear error
    assert b"not in the tenants file" in reply.data
    # And bob's own request, answered through his own account, gets leases (the control)
    own = await b.nc.request(s.lease("bob", node, "acquire"), encode(ask), timeout=5)
    assert b"lease" in own.data
    await eventually(lambda: "bob" in agent.ledger.advert(0).tenants)
    # And no lease is held by alice or mallory, on the node or in what it advertises
    usage = agent.ledger.advert(0).tenants
    assert "alice" not in usage and "mallory" not in usage
    assert not agent.ledger.leases_of("alice", "job") and not agent.ledger.leases_of(
        "mallory", "job"
    )


async def test_a_fake_goodbye_advert_changes_nothing(
    auth_fabric: AuthFabric, connections: Any, agents: Any, fabrics: Any
) -> None:
    # Given a node that alice sees in the fleet
    s = auth_fabric.base.subjects
    agent: Agent = await agents("n-goodbye")
    alice = await fabrics("alice")
    await eventually(lambda: "n-goodbye" in alice.fleet.adverts)
    b = await connections(auth_fabric.tenant("bob"))
    # When bob publishes a goodbye for it, deletes its advert key, or has the server do so
    advert = s.node_advert(agent.settings.node)
    key = s.kv_subject(s.nodes_bucket(), agent.settings.node)
    assert await refused(b.nc.request(advert, b"", timeout=PROMPT_S * 2)) < PROMPT_S
    assert await refused(b.nc.request(key, b"", timeout=PROMPT_S * 2)) < PROMPT_S
    await direct_get_to(b.nc, s, "bob", b"", key, **{"KV-Operation": "DEL"})
    await direct_get_to(b.nc, s, "bob", b"", advert)
    # Then the node stays in the fleet: its advert is in the bucket, as the operator reads it
    op = await connections(auth_fabric.operator)
    kv = await op.js.key_value(s.nodes_bucket())
    first = (await kv.get(agent.settings.node)).revision
    await eventually(lambda: advert_after(kv, agent.settings.node, first))
    assert "n-goodbye" in alice.fleet.adverts


async def advert_after(kv: Any, node: str, revision: int) -> bool:
    """Poll helper: whether the node's advert was written again (a later heartbeat) and is live."""
    entry = await kv.get(node)
    return bool(entry.value) and entry.revision > revision


async def test_a_tenant_cannot_write_another_tenants_jobs_or_work(
    auth_fabric: AuthFabric, connections: Any
) -> None:
    # Given alice's jobs bucket and work stream
    s = auth_fabric.base.subjects
    b = await connections(auth_fabric.tenant("bob"))
    a_op = await connections(auth_fabric.operator_of("alice"))
    job = uuid.uuid4().hex[:12]
    # When bob writes a job spec (say, one running a Python function) and work for alice,
    # directly and through the server
    spec_subject = s.job_spec("alice", job)
    assert await refused(b.js.publish(spec_subject, b"spec")) < PROMPT_S
    await direct_get_to(b.nc, s, "bob", b"spec", spec_subject)
    await direct_get_to(b.nc, s, "bob", b"chunk", s.work("alice", job))
    # Then nothing landed in alice's account
    stream = s.kv_stream(s.jobs_bucket())
    for subjects in (spec_subject, s.kv_job_filter(s.jobs_bucket(), "alice", job)):
        info = await a_op.js.stream_info(stream, subjects_filter=subjects)
        assert not info.state.subjects
    info = await a_op.js.stream_info(s.work_stream("alice"), subjects_filter=s.work("alice", job))
    assert info.state.messages == 0


async def test_the_workers_user_cannot_read_a_tenants_results_through_the_server(
    auth_fabric: AuthFabric, connections: Any
) -> None:
    # Given alice's results, and the workers' user, which may write and direct-get checkpoints
    s = auth_fabric.base.subjects
    a = await connections(auth_fabric.tenant("alice"))
    a_op = await connections(auth_fabric.operator_of("alice"))
    job = uuid.uuid4().hex[:12]
    await a.js.publish(s.result("alice", job, 0), b"alice's result")
    before = await results_of(a_op, s, "alice")
    w = await connections(auth_fabric.worker)
    got: list[bytes] = []
    inbox = f"{s.inbox_prefix('vf_workers')}.{uuid.uuid4().hex}"

    async def on_msg(msg: Any) -> None:
        got.append(msg.data)

    await w.nc.subscribe(inbox, cb=on_msg)
    checkpoints = s.checkpoints_bucket()

    async def create_through_server(stream: str, target: str) -> None:
        """Store a consumer-create request pushing `stream` to our inbox, aim a get at it."""
        request = {
            "stream_name": stream,
            "config": {"deliver_subject": inbox, "ack_policy": "none"},
        }
        key = f"evil{uuid.uuid4().hex[:8]}"
        await w.js.publish(s.kv_subject(checkpoints, key), json.dumps(request).encode())
        get = f"$JS.API.DIRECT.GET.{s.kv_stream(checkpoints)}.{s.kv_subject(checkpoints, key)}"
        await w.nc.publish(get, b"", reply=target)

    # When it has the server ask for a consumer on alice's results stream that pushes them to
    # its inbox, in its own account and through the names under which it reaches alice's
    results = s.results_stream("alice")
    for api in ("$JS.API", s.tenant_api("alice")):
        await create_through_server(results, f"{api}.CONSUMER.CREATE.{results}")
    # And (the control) the same for a stream of its own account
    own = s.kv_stream(checkpoints)
    await create_through_server(own, f"$JS.API.CONSUMER.CREATE.{own}")
    # Then the control's consumer delivers checkpoints to the inbox (the trick ran)
    await eventually(lambda: bool(got))
    # And no consumer reads alice's results, none of them reached the inbox
    info = await a_op.js.stream_info(results)
    assert info.state.consumer_count == 0
    assert b"alice's result" not in got
    assert await results_of(a_op, s, "alice") == before
