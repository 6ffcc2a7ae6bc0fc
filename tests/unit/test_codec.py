"""broker/codec.py, broker/messages/: wire types round-trip; bad payloads are InvalidMessage."""

from __future__ import annotations

from typing import Any

import attrs
import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vramfabric.broker import codec
from vramfabric.broker.calls import CallRequest
from vramfabric.broker.errors import ErrorKind, InvalidMessage, RemoteError
from vramfabric.broker.messages import (
    PROTOCOL_VERSION,
    Chunk,
    ChunkResult,
    ErrorReply,
    Event,
    GpuState,
    JobSpec,
    Lease,
    LeaseGrant,
    LeaseRequest,
    NodeAdvert,
    ReleaseReply,
    ReleaseRequest,
    RenewReply,
    RenewRequest,
)
from vramfabric.broker.retry import RetryPolicy

GiB = 2**30


def raw(body: Any) -> bytes:
    """Pack a hand-built payload the way a (possibly hostile) peer would."""
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return data


def _call_body(**fields: Any) -> bytes:
    body = {"t": "CallRequest", "v": 1, "lease_id": "r1-0", "name": "f", "digest": "d"}
    return raw({**body, "python": "3.11", "input": b"", "timeout_s": 60.0, **fields})


def lease_request_body(**overrides: Any) -> dict[str, Any]:
    """A valid LeaseRequest payload, with fields overridden (or removed with a ... value)."""
    body: dict[str, Any] = {
        "t": "LeaseRequest",
        "v": PROTOCOL_VERSION,
        "request_id": "r1",
        "job": "j1",
        "count": 2,
        "slice_bytes": 1024,
        "ttl_s": 30.0,
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not ...}


def chunk_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "t": "Chunk",
        "v": PROTOCOL_VERSION,
        "job": "j1",
        "index": 0,
        "input": b"\x00\x01",
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not ...}


LEASE = Lease(
    lease_id="r1-0",
    node="n1",
    gpu=1,
    slice_bytes=GiB,
    job="j1",
    tenant="acme",
    expires_at=1_700_000_030.5,
)

WIRE_OBJECTS = [
    NodeAdvert(
        node="n1",
        gpus=(
            GpuState(
                index=0,
                model="H100",
                total_bytes=80 * GiB,
                free_bytes=60 * GiB,
                leased_bytes=20 * GiB,
                slice_bytes=GiB,
            ),
            GpuState(
                index=1,
                model="H100",
                total_bytes=80 * GiB,
                free_bytes=80 * GiB,
                leased_bytes=0,
                slice_bytes=GiB,
                healthy=False,
            ),
        ),
        tenants={"acme": 16 * GiB, "beta": 4 * GiB},
        sent_at=1_700_000_000.25,
    ),
    LeaseRequest(request_id="r1", job="j1", count=3, slice_bytes=512 * 2**20, ttl_s=30.0),
    LeaseGrant(node="n1", leases=(LEASE, attrs.evolve(LEASE, lease_id="r1-1", gpu=0))),
    LeaseGrant(node="n1", leases=(), denied="no free slice of 1073741824 bytes on n1"),
    RenewRequest(lease_ids=("r1-0", "r1-1"), ttl_s=15.0),
    RenewReply(expires_at={"r1-0": 1_700_000_045.0}, unknown=("r1-1",)),
    ReleaseRequest(lease_ids=("r1-0",)),
    ReleaseReply(released=("r1-0",), unknown=("gone",)),
    ErrorReply(kind=ErrorKind.LEASE_DENIED, error="quota exceeded"),
    JobSpec(
        tenant="acme",
        kernel="hyperparam_eval",
        kernel_digest="ab" * 32,
        n_chunks=1000,
        args={"scale": 1.5, "name": "x", "blob": b"\x00\xff", "flag": True, "none": None, "n": 7},
        inputs_digest="cd" * 32,
        retry=RetryPolicy(max_retries=5, initial_backoff_s=0.5, max_backoff_s=8.0),
        ack_wait_s=12.0,
    ),
    JobSpec(tenant="acme", kernel="k", kernel_digest="d", n_chunks=1, job_id="explicit-id"),
    CallRequest("r1-0", "f", "ab" * 32, "3.11", b"\x80\x05N.", 60.0, printed_to="p1"),
    CallRequest("r1-0", "f", "ab" * 32, "3.11", b"", 60.0, input_ref="call-input-0a1b"),
    Chunk(job="j1", index=41, input=bytes(range(256))),
    ChunkResult(
        job="j1",
        index=41,
        ok=True,
        output=b"\x00\x00\x80?",
        attempt=1,
        node="n1",
        lease_id="r1-0",
        started_at=1_700_000_001.0,
        elapsed_s=0.125,
    ),
    ChunkResult(
        job="j1",
        index=42,
        ok=False,
        error_kind=ErrorKind.VRAM_EXCEEDED,
        error="slice VRAM exceeded",
        attempt=3,
    ),
    Event(kind="granted", node="n1", tenant="acme", job="j1", count=3, at=1_700_000_000.0),
]


@pytest.mark.parametrize("obj", WIRE_OBJECTS, ids=lambda o: type(o).__name__)
def test_every_wire_type_round_trips_unchanged(obj: Any) -> None:
    # Given a wire object, When it is encoded and decoded as its own type
    back = codec.decode(type(obj), codec.encode(obj))
    # Then it is equal, field for field
    assert back == obj
    assert type(back) is type(obj)


@pytest.mark.parametrize("obj", WIRE_OBJECTS, ids=lambda o: type(o).__name__)
def test_encoded_payload_is_a_map_tagged_with_type_and_version(obj: Any) -> None:
    body = msgpack.unpackb(codec.encode(obj), raw=False)
    assert body["t"] == type(obj).__name__
    assert body["v"] == PROTOCOL_VERSION


def test_decoded_containers_are_tuples_and_enums_not_lists_and_strings() -> None:
    # Given a grant with leases and a failed result with an error kind
    grant = codec.decode(LeaseGrant, codec.encode(WIRE_OBJECTS[2]))
    failed = codec.decode(ChunkResult, codec.encode(WIRE_OBJECTS[-2]))
    advert = codec.decode(NodeAdvert, codec.encode(WIRE_OBJECTS[0]))
    # Then sequences come back as tuples of attrs classes and the kind as the enum member
    assert isinstance(grant.leases, tuple)
    assert all(isinstance(lease, Lease) for lease in grant.leases)
    assert isinstance(advert.gpus, tuple)
    assert isinstance(advert.gpus[1], GpuState)
    assert advert.gpus[1].healthy is False
    assert failed.error_kind is ErrorKind.VRAM_EXCEEDED


def test_nested_types_carry_no_version_field() -> None:
    body = msgpack.unpackb(codec.encode(WIRE_OBJECTS[0]), raw=False)
    assert "v" not in body["gpus"][0]
    assert "t" not in body["gpus"][0]


def test_job_spec_round_trip_keeps_retry_policy_and_job_id() -> None:
    spec = WIRE_OBJECTS[9]
    assert isinstance(spec, JobSpec)
    back = codec.decode(JobSpec, codec.encode(spec))
    assert back.retry == RetryPolicy(max_retries=5, initial_backoff_s=0.5, max_backoff_s=8.0)
    assert back.retry.max_deliver == 6
    assert back.job_id == spec.job_id
    assert back.args["blob"] == b"\x00\xff"


def test_int_for_a_float_field_is_accepted_as_float() -> None:
    back = codec.decode(LeaseRequest, raw(lease_request_body(ttl_s=30)))
    assert back.ttl_s == 30.0
    assert isinstance(back.ttl_s, float)


def test_missing_optional_fields_take_their_defaults() -> None:
    # Given a grant payload without `denied`
    body = {"t": "LeaseGrant", "v": 1, "node": "n1", "leases": []}
    # Then it decodes with the default
    assert codec.decode(LeaseGrant, raw(body)) == LeaseGrant(node="n1", leases=())


def test_unknown_extra_keys_are_ignored() -> None:
    # Given a payload from a newer peer with fields this version does not know
    body = lease_request_body(priority=5, labels={"a": [1, 2]}, hint=None)
    # When it is decoded
    req = codec.decode(LeaseRequest, raw(body))
    # Then the known fields are read and the rest dropped
    assert req == LeaseRequest(request_id="r1", job="j1", count=2, slice_bytes=1024, ttl_s=30.0)


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = codec.encode(WIRE_OBJECTS[1])
    assert codec.decode(LeaseRequest, bytearray(data)) == WIRE_OBJECTS[1]
    assert codec.decode(LeaseRequest, memoryview(data)) == WIRE_OBJECTS[1]


REJECTED = [
    pytest.param(LeaseRequest, b"\xc1", "not msgpack", id="never-used-byte"),
    pytest.param(LeaseRequest, b"\x92\x01", "not msgpack", id="truncated"),
    pytest.param(LeaseRequest, b"\x01\x02", "not msgpack", id="trailing-data"),
    pytest.param(LeaseRequest, b"", "not msgpack", id="empty"),
    pytest.param(LeaseRequest, raw([1, 2]), "expected a map, got list", id="list"),
    pytest.param(LeaseRequest, raw("LeaseRequest"), "expected a map, got str", id="str"),
    pytest.param(LeaseRequest, raw({1: 2}), "not msgpack", id="int-map-key"),
    pytest.param(
        LeaseRequest, raw(lease_request_body(t="Chunk")), "type tag is 'Chunk'", id="wrong-tag"
    ),
    pytest.param(LeaseRequest, raw(lease_request_body(t=...)), "type tag is None", id="no-tag"),
    pytest.param(
        LeaseRequest, raw(lease_request_body(v=...)), "protocol version None", id="no-version"
    ),
    pytest.param(
        LeaseRequest, raw(lease_request_body(v=2)), "protocol version 2", id="future-version"
    ),
    pytest.param(
        LeaseRequest, raw(lease_request_body(v="1")), "protocol version '1'", id="str-version"
    ),
    pytest.param(LeaseRequest, raw(lease_request_body(v=1.0)), "field 'v'", id="float-version"),
    pytest.param(LeaseRequest, raw(lease_request_body(v=True)), "field 'v'", id="bool-version"),
    pytest.param(
        LeaseRequest,
        raw(lease_request_body(count=...)),
        "missing field 'count'",
        id="missing-count",
    ),
    pytest.param(
        LeaseRequest, raw(lease_request_body(job=...)), "missing field 'job'", id="missing-job"
    ),
    pytest.param(
        LeaseRequest, raw(lease_request_body(count="3")), "field 'count'", id="str-for-int"
    ),
    pytest.param(
        LeaseRequest, raw(lease_request_body(count=True)), "field 'count'", id="true-for-count"
    ),
    pytest.param(
        LeaseRequest, raw(lease_request_body(count=2.0)), "field 'count'", id="float-for-int"
    ),
    pytest.param(LeaseRequest, raw(lease_request_body(job=7)), "field 'job'", id="int-for-str"),
    pytest.param(
        LeaseRequest, raw(lease_request_body(job=b"j1")), "field 'job'", id="bytes-for-str"
    ),
    pytest.param(Chunk, raw(chunk_body(input=[0, 1])), "field 'input'", id="list-for-bytes"),
    pytest.param(Chunk, raw(chunk_body(input="text")), "field 'input'", id="str-for-bytes"),
    pytest.param(LeaseRequest, raw(lease_request_body(count=0)), "count", id="count-zero"),
    pytest.param(LeaseRequest, raw(lease_request_body(count=100_001)), "count", id="count-too-big"),
    pytest.param(
        LeaseRequest, raw(lease_request_body(slice_bytes=0)), "slice_bytes", id="slice-zero"
    ),
    pytest.param(LeaseRequest, raw(lease_request_body(ttl_s=0.0)), "ttl_s", id="ttl-zero"),
    pytest.param(LeaseRequest, raw(lease_request_body(ttl_s=-1.0)), "ttl_s", id="ttl-negative"),
    pytest.param(LeaseRequest, raw(lease_request_body(ttl_s=float("nan"))), "ttl_s", id="ttl-nan"),
    pytest.param(
        LeaseRequest, raw(lease_request_body(ttl_s=86_401.0)), "ttl_s", id="ttl-over-a-day"
    ),
    pytest.param(LeaseRequest, raw(lease_request_body(job="a.b")), "job", id="job-with-dot"),
    pytest.param(
        LeaseRequest,
        raw(lease_request_body(request_id="r*")),
        "request_id",
        id="request-id-wildcard",
    ),
    pytest.param(Chunk, raw(chunk_body(job="j.1")), "job", id="chunk-job-with-dot"),
    pytest.param(Chunk, raw(chunk_body(index=-1)), "index", id="negative-index"),
    pytest.param(
        JobSpec,
        raw(
            {
                "t": "JobSpec",
                "v": 1,
                "tenant": "acme",
                "kernel": "k",
                "kernel_digest": "d",
                "n_chunks": 1,
                "job_id": "my.job",
            }
        ),
        "job_id",
        id="job-id-with-dot",
    ),
    pytest.param(
        JobSpec,
        raw(
            {
                "t": "JobSpec",
                "v": 1,
                "tenant": "acme",
                "kernel": "k",
                "kernel_digest": "d",
                "n_chunks": 1,
                "args": {"nested": {"a": 1}},
            }
        ),
        "field 'args'",
        id="nested-arg",
    ),
    pytest.param(
        JobSpec,
        raw(
            {
                "t": "JobSpec",
                "v": 1,
                "tenant": "acme",
                "kernel": "k",
                "kernel_digest": "d",
                "n_chunks": 1,
                "retry": {"max_retries": -1},
            }
        ),
        "max_retries",
        id="bad-nested-retry",
    ),
    pytest.param(
        NodeAdvert,
        raw(
            {
                "t": "NodeAdvert",
                "v": 1,
                "node": "n1",
                "gpus": [{"index": 0}],
                "tenants": {},
                "sent_at": 0.0,
            }
        ),
        "missing field 'model'",
        id="gpu-missing-fields",
    ),
    pytest.param(
        NodeAdvert,
        raw({"t": "NodeAdvert", "v": 1, "node": "n1", "gpus": {}, "tenants": {}, "sent_at": 0.0}),
        "field 'gpus'",
        id="map-for-tuple",
    ),
    pytest.param(
        NodeAdvert,
        raw(
            {
                "t": "NodeAdvert",
                "v": 1,
                "node": "n1",
                "gpus": [],
                "tenants": {"a": "x"},
                "sent_at": 0.0,
            }
        ),
        "field 'tenants'",
        id="str-tenant-usage",
    ),
    pytest.param(
        ChunkResult,
        raw(
            {
                "t": "ChunkResult",
                "v": 1,
                "job": "j",
                "index": 0,
                "ok": False,
                "error_kind": "melted",
            }
        ),
        "field 'error_kind'",
        id="unknown-error-kind",
    ),
    pytest.param(
        ChunkResult,
        raw({"t": "ChunkResult", "v": 1, "job": "j", "index": 0, "ok": 1}),
        "field 'ok'",
        id="int-for-bool",
    ),
    pytest.param(
        CallRequest,
        _call_body(input=b"x", input_ref="call-input-1"),
        "not both",
        id="call-input-carried-and-named",
    ),
    pytest.param(
        CallRequest,
        _call_body(input_ref="../vf_kernels_bob/x"),
        "input_ref",
        id="call-input-name-not-a-token",
    ),
]


# A nested type's own error surfaces unwrapped, naming the nested type.
NESTED_AT_FAULT = {"max_retries": "RetryPolicy", "missing field 'model'": "GpuState"}


@pytest.mark.parametrize(("cls", "data", "why"), REJECTED)
def test_bad_payload_is_rejected_as_invalid_message(cls: type, data: bytes, why: str) -> None:
    # When a bad payload is decoded
    with pytest.raises(InvalidMessage) as info:
        codec.decode(cls, data)
    # Then the error names the expected type (or the nested one at fault) and says what was wrong
    assert info.value.what == NESTED_AT_FAULT.get(why, cls.__name__)
    assert why in info.value.why
    assert info.value.kind is ErrorKind.INVALID_MESSAGE


# Regression: _float once passed the union `int | float` to _expect, whose message read
# tp.__name__, so a non-number in a float field raised AttributeError instead.
@pytest.mark.parametrize("bad", ["soon", True, [1.0], None, b"1"], ids=repr)
def test_non_number_for_a_float_field_is_invalid_message(bad: Any) -> None:
    with pytest.raises(InvalidMessage, match="ttl_s"):
        codec.decode(LeaseRequest, raw(lease_request_body(ttl_s=bad)))


def test_payload_over_max_bytes_is_rejected_before_unpacking() -> None:
    data = codec.encode(WIRE_OBJECTS[1])
    # Given a limit one byte short of the payload
    with pytest.raises(InvalidMessage, match=f"payload of {len(data)} bytes exceeds"):
        codec.decode(LeaseRequest, data, max_bytes=len(data) - 1)
    # Then exactly at the limit it decodes
    assert codec.decode(LeaseRequest, data, max_bytes=len(data)) == WIRE_OBJECTS[1]


def test_payload_over_default_limit_is_rejected() -> None:
    data = raw(chunk_body(input=b"\x00" * codec.MAX_PAYLOAD_BYTES))
    with pytest.raises(InvalidMessage, match="exceeds"):
        codec.decode(Chunk, data)


def test_non_bytes_payload_is_rejected() -> None:
    with pytest.raises(InvalidMessage, match="payload is str"):
        codec.decode(LeaseRequest, "not bytes")  # type: ignore[arg-type]


def test_error_reply_decoded_as_another_type_raises_remote_error_with_kind() -> None:
    # Given a node that answered a lease request with an error
    data = codec.encode(ErrorReply(kind=ErrorKind.LEASE_DENIED, error="quota exceeded"))
    # When the caller decodes it as the reply it expected
    with pytest.raises(RemoteError) as info:
        codec.decode(LeaseGrant, data)
    # Then the error carries the remote kind and message
    assert info.value.remote_kind is ErrorKind.LEASE_DENIED
    assert info.value.error == "quota exceeded"
    assert "lease_denied: quota exceeded" in str(info.value)
    assert not isinstance(info.value, InvalidMessage)


def test_error_reply_decoded_as_error_reply_is_returned() -> None:
    reply = ErrorReply(kind=ErrorKind.DISCONNECTED, error="x")
    assert codec.decode(ErrorReply, codec.encode(reply)) == reply


def test_malformed_error_reply_is_invalid_message_not_remote_error() -> None:
    data = raw({"t": "ErrorReply", "v": 1, "kind": "melted", "error": "x"})
    with pytest.raises(InvalidMessage, match="kind"):
        codec.decode(LeaseGrant, data)


# --- properties -------------------------------------------------------------------------

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
)
msgpack_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
_tokens = st.from_regex(r"[A-Za-z0-9_-]{1,8}", fullmatch=True)
_opt_float = st.floats(allow_nan=False, allow_infinity=False)

VALID_FIELDS: dict[type, dict[str, st.SearchStrategy[Any]]] = {
    LeaseRequest: {
        "request_id": _tokens,
        "job": _tokens,
        "count": st.integers(1, 100_000),
        "slice_bytes": st.integers(1, 2**40),
        "ttl_s": st.floats(0.001, 86_400),
    },
    Chunk: {"job": _tokens, "index": st.integers(0, 2**40), "input": st.binary(max_size=16)},
    ChunkResult: {
        "job": _tokens,
        "index": st.integers(0, 2**40),
        "ok": st.booleans(),
        "output": st.none() | st.binary(max_size=8),
        "error_kind": st.none() | st.sampled_from([k.value for k in ErrorKind]),
        "error": st.none() | st.text(max_size=8),
        "attempt": st.integers(1, 100),
        "node": _tokens,
        "lease_id": _tokens,
        "started_at": _opt_float,
        "elapsed_s": _opt_float,
    },
}


def bodies(cls: type) -> st.SearchStrategy[dict[str, Any]]:
    """Maps tagged as `cls` at this version, each field valid, random or absent, plus extras."""
    fields = VALID_FIELDS[cls]
    known = st.fixed_dictionaries(
        {}, optional={name: valid | msgpack_values for name, valid in fields.items()}
    )
    extra = st.dictionaries(
        st.text(max_size=6).filter(lambda k: k not in fields), msgpack_values, max_size=2
    )
    return st.builds(
        lambda k, e: {**e, **k, "t": cls.__name__, "v": PROTOCOL_VERSION}, known, extra
    )


def decodes_or_is_invalid(cls: type[object], data: bytes) -> None:
    """The property: a `cls`, or InvalidMessage; any other exception fails the test."""
    try:
        out = codec.decode(cls, data)
    except InvalidMessage:
        return
    assert isinstance(out, cls)


@pytest.mark.parametrize("cls", [LeaseRequest, Chunk, ChunkResult], ids=lambda c: c.__name__)
@FUZZ
@given(data=st.binary(max_size=256))
def test_arbitrary_bytes_decode_or_raise_invalid_message(cls: type, data: bytes) -> None:
    decodes_or_is_invalid(cls, data)


@FUZZ
@given(body=bodies(Chunk))
def test_random_chunk_maps_decode_or_raise_invalid_message(body: dict[str, Any]) -> None:
    decodes_or_is_invalid(Chunk, raw(body))


@FUZZ
@example(body=lease_request_body(ttl_s="soon"))
@given(body=bodies(LeaseRequest))
def test_random_lease_request_maps_decode_or_raise_invalid_message(body: dict[str, Any]) -> None:
    decodes_or_is_invalid(LeaseRequest, raw(body))


@FUZZ
@example(
    body={"t": "ChunkResult", "v": 1, "job": "j", "index": 0, "ok": True, "started_at": "noon"}
)
@given(body=bodies(ChunkResult))
def test_random_chunk_result_maps_decode_or_raise_invalid_message(body: dict[str, Any]) -> None:
    decodes_or_is_invalid(ChunkResult, raw(body))
