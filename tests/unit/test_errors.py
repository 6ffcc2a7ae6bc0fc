"""broker/errors/: the transient/permanent tree, ErrorKind per class, and from_nats."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from vramfabric.broker import errors as e
from vramfabric.broker.errors import ErrorKind


def test_result_already_recorded_is_read_from_err_code_10077_on_a_503() -> None:
    # Given the results stream refusing a second result for a subject
    exc = nats.js.errors.ServiceUnavailableError(
        code=503, err_code=10077, description="maximum messages per subject exceeded"
    )
    # When it is mapped
    mapped = e.from_nats(exc)
    # Then it means "already recorded", not "retry"
    assert isinstance(mapped, e.ResultAlreadyRecorded)
    assert not isinstance(mapped, e.TransientError)


def test_err_code_10077_wins_whatever_the_status_code() -> None:
    mapped = e.from_nats(nats.js.errors.APIError(code=400, err_code=e.ERR_CODE_RESULT_RECORDED))
    assert isinstance(mapped, e.ResultAlreadyRecorded)


@pytest.mark.parametrize(
    "exc",
    [
        nats.js.errors.ServiceUnavailableError(code=503, err_code=10039, description="no js"),
        nats.js.errors.ServiceUnavailableError(code=503),
        nats.js.errors.ServerError(code=500, err_code=10049, description="boom"),
        nats.js.errors.APIError(code=504),
    ],
    ids=["503-other-err-code", "503-no-err-code", "500", "504"],
)
def test_other_5xx_api_errors_are_disconnected(exc: Exception) -> None:
    mapped = e.from_nats(exc)
    assert isinstance(mapped, e.Disconnected)
    assert "jetstream unavailable" in str(mapped)


def test_service_unavailable_without_code_is_disconnected() -> None:
    # Given the 503 nats-py raises from a status-header reply (no code attribute set)
    exc = nats.js.errors.ServiceUnavailableError()
    # Then it is transient like every other 503
    assert isinstance(e.from_nats(exc), e.Disconnected)


def test_not_found_is_permanent() -> None:
    mapped = e.from_nats(
        nats.js.errors.NotFoundError(code=404, err_code=10059, description="stream not found")
    )
    assert isinstance(mapped, e.PermanentError)
    assert "stream not found" in str(mapped)


def test_no_peers_for_placement_is_transient() -> None:
    # A replicated stream asked of a cluster still forming: tried again, not given up on
    exc = nats.js.errors.APIError(
        code=400, err_code=e.ERR_CODE_NO_PEERS, description="no suitable peers for placement"
    )
    assert isinstance(e.from_nats(exc), e.Disconnected)


def test_other_4xx_api_errors_are_permanent() -> None:
    mapped = e.from_nats(nats.js.errors.BadRequestError(code=400, err_code=10058))
    assert type(mapped) is e.PermanentError
    assert "jetstream error" in str(mapped)


@pytest.mark.parametrize(
    "exc",
    [
        nats.errors.NoRespondersError(),
        nats.errors.TimeoutError(),
        TimeoutError(),  # asyncio.TimeoutError is this builtin since 3.11
        nats.errors.ConnectionClosedError(),
        nats.errors.NoServersError(),
        ConnectionRefusedError("refused"),
        OSError("network down"),
    ],
    ids=lambda x: type(x).__name__,
)
def test_transport_failures_are_disconnected(exc: BaseException) -> None:
    mapped = e.from_nats(exc)
    assert isinstance(mapped, e.Disconnected)
    assert mapped.kind is ErrorKind.DISCONNECTED


def test_no_responders_and_timeouts_say_which() -> None:
    assert str(e.from_nats(nats.errors.NoRespondersError())) == "no responders"
    assert str(e.from_nats(TimeoutError())) == "request timed out"
    assert str(e.from_nats(nats.errors.TimeoutError())) == "request timed out"


def test_vramfabric_errors_pass_through_unchanged() -> None:
    original = e.LeaseExpired("l1")
    assert e.from_nats(original) is original


@pytest.mark.parametrize(
    "exc",
    [RuntimeError("odd"), TypeError("bad arg"), KeyError("k"), FileNotFoundError("f")],
    ids=lambda x: type(x).__name__,
)
def test_unrelated_exceptions_pass_through_unchanged(exc: Exception) -> None:
    # A bug is not a broker failure: it must not be retried nor dressed as our root error.
    assert e.from_nats(exc) is exc


@pytest.mark.parametrize(
    "exc",
    [
        nats.errors.Error('nats: permissions violation for publish to "vf.work.b.j1"'),
        nats.errors.AuthorizationError(),
        nats.js.errors.APIError(code=403, description="forbidden"),
    ],
    ids=["publish-violation", "authorization", "api-403"],
)
def test_permission_refusals_are_permission_denied(exc: Exception) -> None:
    mapped = e.from_nats(exc)
    assert isinstance(mapped, e.PermissionDenied)
    assert isinstance(mapped, e.PermanentError)


def test_nats_errors_raises_ours_from_the_original() -> None:
    original = nats.errors.NoRespondersError()
    with pytest.raises(e.Disconnected) as info, e.nats_errors():
        raise original
    assert info.value.__cause__ is original


def test_nats_errors_lets_unknown_and_our_errors_through_unchanged() -> None:
    bug = TypeError("unsupported operand")
    with pytest.raises(TypeError) as info, e.nats_errors():
        raise bug
    assert info.value is bug
    assert info.value.__cause__ is None
    ours = e.LeaseExpired("l1")
    with pytest.raises(e.LeaseExpired) as got, e.nats_errors():
        raise ours
    assert got.value is ours


@pytest.mark.parametrize("cls", [e.Disconnected, e.LeaseExpired, e.LeaseDenied])
def test_transient_family(cls: type) -> None:
    assert issubclass(cls, e.TransientError)
    assert not issubclass(cls, e.PermanentError)


@pytest.mark.parametrize(
    "cls",
    [
        e.InvalidMessage,
        e.KernelNotFound,
        e.KernelLoadFailed,
        e.SliceVramExceeded,
        e.ServerError,
    ],
)
def test_permanent_family(cls: type) -> None:
    assert issubclass(cls, e.PermanentError)
    assert not issubclass(cls, e.TransientError)


@pytest.mark.parametrize(
    "cls",
    [e.ResultAlreadyRecorded, e.CapacityExceeded, e.JobFailed, e.JobTimeout],
)
def test_outcomes_that_are_neither_retried_nor_failed_at_once(cls: type) -> None:
    assert issubclass(cls, e.VramfabricError)
    assert not issubclass(cls, e.TransientError | e.PermanentError)


@pytest.mark.parametrize(
    ("cls", "kind"),
    [
        (e.VramfabricError, ErrorKind.ERROR),
        (e.TransientError, ErrorKind.ERROR),
        (e.PermanentError, ErrorKind.ERROR),
        (e.Disconnected, ErrorKind.DISCONNECTED),
        (e.LeaseExpired, ErrorKind.LEASE_EXPIRED),
        (e.LeaseDenied, ErrorKind.LEASE_DENIED),
        (e.InvalidMessage, ErrorKind.INVALID_MESSAGE),
        (e.KernelNotFound, ErrorKind.KERNEL_NOT_FOUND),
        (e.KernelLoadFailed, ErrorKind.LOAD_FAILED),
        (e.SliceVramExceeded, ErrorKind.VRAM_EXCEEDED),
        (e.ResultAlreadyRecorded, ErrorKind.ERROR),
        (e.ServerError, ErrorKind.ERROR),
        (e.ResultRefused, ErrorKind.RESULT_REFUSED),
    ],
)
def test_error_kind_per_class(cls: type[e.VramfabricError], kind: ErrorKind) -> None:
    assert cls.kind is kind


def test_error_kinds_are_strings_on_the_wire() -> None:
    kind: str = ErrorKind.VRAM_EXCEEDED
    assert kind == "vram_exceeded"
    assert ErrorKind("lease_expired") is ErrorKind.LEASE_EXPIRED
    assert len({k.value for k in ErrorKind}) == len(ErrorKind)


def test_errors_carry_their_details() -> None:
    expired = e.LeaseExpired("r1-0")
    assert expired.lease_id == "r1-0"
    assert "r1-0" in str(expired)
    denied = e.LeaseDenied("n1", "full")
    assert (denied.node, denied.reason) == ("n1", "full")
    assert str(denied) == "node n1 denied the lease: full"
    vram = e.SliceVramExceeded(limit_bytes=100, requested_bytes=200)
    assert "limit_bytes=100" in str(vram)
    assert "requested_bytes=200" in str(vram)
    invalid = e.InvalidMessage("Chunk", "bad")
    assert (invalid.what, invalid.why, str(invalid)) == ("Chunk", "bad", "invalid Chunk: bad")
    missing = e.KernelNotFound("k")
    assert missing.name == "k"
    capacity = e.CapacityExceeded(wanted=10, got=3)
    assert (capacity.wanted, capacity.got) == (10, 3)
    failed = e.JobFailed("j", 2, ("a", "b"))
    assert (failed.job, failed.n_failed, failed.failures) == ("j", 2, ("a", "b"))


def test_job_timeout_is_a_timeout_error() -> None:
    assert isinstance(e.JobTimeout("late"), TimeoutError)


@pytest.mark.parametrize(
    "exc",
    [
        nats.errors.MaxPayloadError(),
        nats.errors.BadSubjectError(),
        nats.errors.InvalidUserCredentialsError(),
        nats.js.errors.InvalidKeyError(),
        nats.js.errors.DigestMismatchError(),
        nats.js.errors.KeyValueLimitMarkerTTLNotSupportedError(),
    ],
    ids=lambda x: type(x).__name__,
)
def test_errors_about_the_call_itself_are_permanent_not_retried(exc: Exception) -> None:
    # A payload over the limit or bad credentials stays so however often it is retried
    mapped = e.from_nats(exc)
    assert type(mapped) is e.PermanentError
    assert type(exc).__name__ in str(mapped)
