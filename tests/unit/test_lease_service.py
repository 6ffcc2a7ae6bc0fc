"""The lease service: hostile payloads never raise and change nothing; unanswerable refused."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg

from vramfabric.broker import Subjects, encode
from vramfabric.broker.messages import LeaseGrant, LeaseRequest
from vramfabric.broker.tenants import TenantPolicy
from vramfabric.worker.leases.fairness import FleetShare, ShareTiming
from vramfabric.worker.leases.lease_service import LeaseService
from vramfabric.worker.leases.ledger import SliceLedger
from vramfabric.worker.node.advert_book import AdvertBook
from vramfabric.worker.node.gpus import GpuSpec
from vramfabric.worker.node.metrics import WorkerMetrics

GIB = 2**30
SUBJECTS = Subjects("vf")
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=20),
    st.binary(max_size=20),
)
fields = st.sampled_from(
    ["t", "v", "request_id", "job", "count", "slice_bytes", "ttl_s", "lease_ids"]
)
maps = st.dictionaries(fields, st.one_of(scalars, st.lists(scalars, max_size=3)), max_size=8)
hostile = st.one_of(
    st.binary(max_size=300),
    maps.map(lambda m: msgpack.packb(m, use_bin_type=True)),
    st.builds(lambda m: msgpack.packb({"t": "LeaseRequest", "v": 1, **m}, use_bin_type=True), maps),
)


def service() -> tuple[LeaseService, SliceLedger, WorkerMetrics, list[str]]:
    """A lease service over a 2-GPU ledger, recording the events it publishes."""
    ledger = SliceLedger("n1", (GpuSpec(0, "sim", 4 * GIB), GpuSpec(1, "sim", 4 * GIB)), GIB)
    metrics = WorkerMetrics()
    events: list[str] = []

    async def publish(subject: str, _data: bytes) -> None:
        events.append(subject)

    timing = ShareTiming(waiting_ttl_s=5.0)
    fair = FleetShare(ledger, TenantPolicy(), AdvertBook(node_ttl_s=5.0), timing)
    svc = LeaseService(
        SUBJECTS, "n1", ledger, metrics, lambda _t, _j: None, publish=publish, fair=fair
    )
    return svc, ledger, metrics, events


def request(op: str, data: bytes, reply: str = "") -> Msg:
    """A lease request as the service's handler receives it (no reply subject by default)."""
    subject = SUBJECTS.lease("t1", "n1", op)
    # nats-py types the client as required; with no reply subject nothing calls it.
    return Msg(_client=None, subject=subject, data=data, reply=reply)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(payload=hostile, op=st.sampled_from(["acquire", "renew", "release"]))
def test_hostile_payload_never_raises_and_grants_nothing_unless_valid(
    payload: bytes, op: str
) -> None:
    # Given a serving node
    svc, ledger, metrics, _events = service()
    msg = request(op, payload)
    # When a hostile payload arrives
    asyncio.run(svc.answer(msg.subject, msg.data))
    # Then it was either a valid request, or it was counted as invalid and changed nothing
    counted = metrics.value("invalid_messages_total", subject=f"lease.{op}")
    served = metrics.value("gpu_lease_requests_total", op=op, outcome="ok") + metrics.value(
        "gpu_lease_requests_total", op=op, outcome="denied"
    )
    assert counted + served == 1
    if counted:
        assert len(ledger) == 0


def test_a_valid_request_still_grants_after_garbage() -> None:
    # Given a node that has seen garbage
    svc, ledger, _metrics, _events = service()
    asyncio.run(svc.answer(SUBJECTS.lease("t1", "n1", "acquire"), b"\xc1"))
    # When a valid request follows
    req = LeaseRequest(request_id="r1", job="j", count=3, slice_bytes=GIB, ttl_s=5)
    reply, tenant, outcome = asyncio.run(
        svc.answer(SUBJECTS.lease("t1", "n1", "acquire"), encode(req))
    )
    # Then it is granted to the subject's tenant
    assert len(ledger) == 3 and (tenant, outcome) == ("t1", "ok")
    assert isinstance(reply, LeaseGrant) and len(reply.leases) == 3


@pytest.mark.parametrize("reply", ["", "vf.lease.t2.n1.acquire", "elsewhere"])
def test_a_request_without_an_inbox_to_answer_is_refused_and_changes_nothing(reply: str) -> None:
    # Given a serving node
    svc, ledger, metrics, events = service()
    req = LeaseRequest(request_id="r1", job="j", count=3, slice_bytes=GIB, ttl_s=5)

    async def ask() -> None:
        await svc.handle(request("acquire", encode(req), reply=reply))
        await svc.close()

    # When a valid acquire arrives with no reply subject, or one that is not an inbox
    asyncio.run(ask())
    # Then nothing is granted or published, and it is counted as refused
    assert len(ledger) == 0 and events == []
    assert metrics.value("invalid_messages_total", subject="lease.reply") == 1
