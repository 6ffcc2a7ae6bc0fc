"""The exception classes of vramfabric and the ErrorKind each carries on the wire.

Transient errors are retried, permanent ones are not; the rest are outcomes a caller
handles (a result already recorded, a job failed, timed out or cancelled).
"""

from __future__ import annotations

import enum
from typing import ClassVar


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


class RemoteError(VramfabricError):
    """A peer's failure it could not send as itself: an ErrorReply, or a call's unpicklable raise.

    The one RemoteError: a request answered with an ErrorReply raises it (`decode`), and so
    does an interactive call whose exception did not travel back (coordinator/calls/remote.py).
    """

    def __init__(self, kind: ErrorKind, error: str) -> None:
        super().__init__(f"{kind.value}: {error}")
        self.remote_kind = kind
        self.error = error
