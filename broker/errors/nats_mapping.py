"""`from_nats`: the single place where nats-py exceptions become errors of our tree.

nats-py is imported inside the functions: executors raise and carry our errors but never
talk to NATS, and importing nats-py cost each one's start 0.1 s.
"""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .tree import (
    Disconnected,
    LimitExceeded,
    PermanentError,
    PermissionDenied,
    ResultAlreadyRecorded,
    VramfabricError,
)

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
