"""The one exception tree of vramfabric: transient errors are retried, permanent ones are not.

Every error carries an `ErrorKind`, the value that travels in `ChunkResult.error_kind` and in
error replies. `from_nats` is the single place where nats-py exceptions become ours.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import nats.js.errors

# JetStream err_code for "maximum messages per subject exceeded": on the first-result-wins
# results stream it means "a result is already recorded", not "retry" (NATS_GUIDE.md section 2).
ERR_CODE_RESULT_RECORDED = 10077
# JetStream's refusals at an account's limits (broker/limits.py), by err_code: what ran out.
_ACCOUNT_LIMITS = {
    10002: "storage limit (tenants file: storage / memory_storage)",
    10026: "consumers limit (tenants file: consumers)",
    10027: "streams limit (tenants file: streams)",
    10028: "memory storage limit (tenants file: memory_storage)",
    10047: "storage limit (tenants file: storage)",
}
# JetStream err_code for "no suitable peers for placement": a replicated stream asked of a
# cluster still forming (or with a server down) is refused until enough servers are up.
ERR_CODE_NO_PEERS = 10005


class ErrorKind(enum.StrEnum):
    """Wire value naming the class of a failure."""

    LOAD_FAILED = "load_failed"
    LAUNCH_FAILED = "launch_failed"
    VRAM_EXCEEDED = "vram_exceeded"
    LEASE_EXPIRED = "lease_expired"
    LEASE_DENIED = "lease_denied"
    DISCONNECTED = "disconnected"
    INVALID_MESSAGE = "invalid_message"
    KERNEL_NOT_FOUND = "kernel_not_found"
    EXHAUSTED = "exhausted"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    CODE_REFUSED = "code_refused"
    RESULT_REFUSED = "result_refused"
    BUSY = "busy"
    ERROR = "error"


class VramfabricError(Exception):
    """Root of every vramfabric error; never raised bare."""

    kind: ClassVar[ErrorKind] = ErrorKind.ERROR


class TransientError(VramfabricError):
    """A failure that may pass: the chunk is redelivered until its deliveries run out."""


class Disconnected(TransientError):
    """The NATS connection or a request to a peer failed or timed out."""

    kind = ErrorKind.DISCONNECTED


class StaleRead(TransientError):
    """A replica answered a read from before this client's own write to the same key."""


class LeaseExpired(TransientError):
    """The lease a chunk ran on was reaped before the chunk finished."""

    kind = ErrorKind.LEASE_EXPIRED

    def __init__(self, lease_id: str) -> None:
        super().__init__(f"lease {lease_id} expired")
        self.lease_id = lease_id


class LeaseDenied(TransientError):
    """A node refused a lease request (no capacity, stale advert, quota)."""

    kind = ErrorKind.LEASE_DENIED

    def __init__(self, node: str, reason: str) -> None:
        super().__init__(f"node {node} denied the lease: {reason}")
        self.node = node
        self.reason = reason


class ChunkTimeout(TransientError):
    """A chunk ran past its deadline; its executor was killed and respawned."""

    kind = ErrorKind.TIMEOUT

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"chunk ran past its deadline of {timeout_s:g} s; its executor was killed")
        self.timeout_s = timeout_s


class ExecutorCrashed(TransientError):
    """The executor process running a chunk died (segfault, os._exit, sticky CUDA error)."""

    kind = ErrorKind.CRASHED


class PermanentError(VramfabricError):
    """A failure that will not pass by retrying: the chunk fails at once."""


class InvalidMessage(PermanentError):
    """A payload did not decode or validate (bad msgpack, wrong types, version, size)."""

    kind = ErrorKind.INVALID_MESSAGE

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"invalid {what}: {why}")
        self.what = what
        self.why = why


class KernelNotFound(PermanentError):
    """No kernel of that name (or digest) is registered on this node, or on any live node."""

    kind = ErrorKind.KERNEL_NOT_FOUND

    def __init__(self, name: str, why: str = "") -> None:
        super().__init__(f"unknown kernel {name!r}" + (f": {why}" if why else ""))
        self.name = name


class KernelLoadFailed(PermanentError):
    """The kernel did not load or compile; carries the compiler's message."""

    kind = ErrorKind.LOAD_FAILED


class KernelLaunchFailed(PermanentError):
    """The kernel rejected its arguments, input or launch shape."""

    kind = ErrorKind.LAUNCH_FAILED


class SliceVramExceeded(PermanentError):
    """A chunk asked for more device memory than its lease's slice holds."""

    kind = ErrorKind.VRAM_EXCEEDED

    def __init__(self, limit_bytes: int, requested_bytes: int) -> None:
        super().__init__(
            f"slice VRAM exceeded: limit_bytes={limit_bytes} requested_bytes={requested_bytes}"
        )
        self.limit_bytes = limit_bytes
        self.requested_bytes = requested_bytes


class ChunkFailed(PermanentError):
    """A chunk's work failed in its executor; `error_kind` is how, as the executor saw it."""

    def __init__(self, error_kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.error_kind = error_kind


class PermissionDenied(PermanentError):
    """The server refused an operation this user's permissions do not allow (never retried)."""


class LimitExceeded(PermanentError):
    """The tenant's account is at one of its limits (storage, streams, consumers): never retried."""


class CodeRefused(PermanentError):
    """A worker refused to run a job's Python code (no --allow-code, or another Python)."""

    kind = ErrorKind.CODE_REFUSED


class ResultRefused(PermanentError):
    """A chunk's result cannot be stored, for a reason retrying cannot fix (size, permission)."""

    kind = ErrorKind.RESULT_REFUSED

    def __init__(self, why: BaseException) -> None:
        super().__init__(f"result not stored: {why}")
        self.why = why


class ResultAlreadyRecorded(VramfabricError):
    """The results stream already holds a result for this chunk: the first one won."""


class RetriesExhausted(VramfabricError):
    """A chunk used up its deliveries without a final result."""

    kind = ErrorKind.EXHAUSTED


class CapacityExceeded(VramfabricError):
    """The fleet gave fewer leases than a strict caller demanded."""

    def __init__(self, wanted: int, got: int) -> None:
        super().__init__(f"wanted {wanted} leases, the fleet gave {got}")
        self.wanted = wanted
        self.got = got


class SliceTooLarge(PermanentError):
    """No GPU of the fleet is as large as the slice asked for: waiting would never end."""


class JobFailed(VramfabricError):
    """A job finished with failed chunks; `failures` holds a bounded sample of them."""

    def __init__(self, job: str, n_failed: int, failures: tuple[object, ...]) -> None:
        super().__init__(f"job {job}: {n_failed} chunk(s) failed")
        self.job = job
        self.n_failed = n_failed
        self.failures = failures


class JobTimeout(VramfabricError, TimeoutError):
    """A job did not finish within its deadline."""


class JobCancelled(VramfabricError):
    """The job was cancelled (`vramfabric cancel`) while it ran."""


class JobNotFound(PermanentError):
    """No job of this id is stored for the tenant."""


class ServerError(PermanentError):
    """The embedded nats-server did not start or stop as asked."""


@functools.cache
def _refused_by_client() -> tuple[type[Exception], ...]:
    """nats-py's errors about the call itself: trying again cannot help (not Disconnected).

    A bad subject, key or payload, bad credentials, a server without a needed feature.
    """
    import nats.errors
    import nats.js.errors

    return (
        nats.errors.MaxPayloadError,
        nats.errors.BadSubjectError,
        nats.errors.BadHeaderError,
        nats.errors.InvalidUserCredentialsError,
        nats.errors.MsgAlreadyAckdError,
        nats.errors.NotJSMessageError,
        nats.js.errors.InvalidKeyError,
        nats.js.errors.InvalidBucketNameError,
        nats.js.errors.InvalidObjectNameError,
        nats.js.errors.DigestMismatchError,
        nats.js.errors.KeyValueLimitMarkerTTLNotSupportedError,
    )


def from_nats(exc: BaseException) -> BaseException:
    """Map a nats-py (or asyncio timeout, network) exception onto the vramfabric tree.

    Anything else (a bug such as a TypeError, a cancellation) is returned unchanged: it is
    not a broker failure, so it must neither be retried nor be dressed as our error.
    """
    if isinstance(exc, VramfabricError):
        return exc
    # Imported here: executors raise and carry these errors but never talk to NATS, and
    # importing nats-py cost each one's start 0.1 s.
    import nats.errors
    import nats.js.errors

    if isinstance(exc, nats.js.errors.APIError):
        return _from_api_error(exc)
    if isinstance(exc, nats.errors.AuthorizationError):
        return PermissionDenied(f"nats: {exc}")
    if isinstance(exc, nats.errors.Error) and "permissions violation" in str(exc).lower():
        return PermissionDenied(str(exc))
    if isinstance(exc, nats.errors.NoRespondersError):
        return Disconnected("no responders")
    if isinstance(exc, TimeoutError | nats.errors.TimeoutError):  # asyncio.TimeoutError too
        return Disconnected("request timed out")
    if isinstance(exc, _refused_by_client()):
        return PermanentError(f"nats: {type(exc).__name__}: {exc}")
    # Only network OSErrors: a FileNotFoundError or an OS PermissionError is not a blip.
    if isinstance(exc, nats.errors.Error | ConnectionError | socket.gaierror) or (
        type(exc) is OSError
    ):
        return Disconnected(f"nats: {exc}")
    return exc


def _from_api_error(exc: nats.js.errors.APIError) -> VramfabricError:
    import nats.js.errors

    # err_code first: 10077 arrives as a 503 that must not be read as "retry".
    err_code, code = getattr(exc, "err_code", None), getattr(exc, "code", None)
    if err_code == ERR_CODE_RESULT_RECORDED:
        return ResultAlreadyRecorded(str(exc))
    if err_code in _ACCOUNT_LIMITS:
        return LimitExceeded(
            f"refused: the tenant's account is at its {_ACCOUNT_LIMITS[err_code]}; remove old "
            f"jobs (`vramfabric rm`) or ask the operator for more ({exc})"
        )
    if err_code == ERR_CODE_NO_PEERS:
        return Disconnected(f"jetstream cluster short of servers: {exc}")
    # A 503 status header gives a ServiceUnavailableError with no code set.
    if isinstance(exc, nats.js.errors.ServiceUnavailableError) or (code or 0) >= 500:
        return Disconnected(f"jetstream unavailable: {exc}")
    if code == 403:
        return PermissionDenied(f"jetstream refused: {exc}")
    if isinstance(exc, nats.js.errors.NotFoundError | nats.js.errors.KeyNotFoundError):
        return PermanentError(f"not found: {exc}")
    return PermanentError(f"jetstream error: {exc}")


@contextlib.contextmanager
def nats_errors() -> Iterator[None]:
    """Raise nats-py errors from the block as ours (via `from_nats`); others pass unchanged."""
    try:
        yield
    except Exception as exc:  # re-raised: mapped if it is nats-py's, else unchanged
        mapped = from_nats(exc)
        if mapped is exc:
            raise
        raise mapped from exc
