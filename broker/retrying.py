"""CallRetry: the one policy for calls to NATS that may fail for a moment.

Connects, publishes, resubscribes, topology calls and lease requests all go through
`CallRetry.call`. Only a `TransientError` (a nats-py failure that `nats_errors` maps to one,
such as a timeout, no responders or a 503 during a leader election) is tried again, after a
jittered exponential pause, until the deadline. A permanent error (`PermissionDenied`, a
refused request) and any exception that is not ours (a bug such as a TypeError) surface at
once, unchanged.

This is not the chunk `RetryPolicy` (broker/retry.py): that one travels in the JobSpec and
tells JetStream when to deliver a chunk again; this one retries a single client call here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import attrs

from .errors import TransientError, nats_errors

if TYPE_CHECKING:
    from tenacity import RetryCallState
from .retry import positive

log = logging.getLogger(__name__)

T = TypeVar("T")


def _positive_or_none(inst: object, attr: attrs.Attribute[float], value: float | None) -> None:
    if value is not None:
        positive(inst, attr, value)


@attrs.frozen
class CallRetry:
    """Retry a call's transient failures with full-jitter exponential pauses, up to a deadline.

    The n-th pause is drawn uniformly from `[0, min(max_pause_s, pause_s * 2**(n-1))]`, so
    clients that lost the same server do not come back in step. No attempt starts after
    `deadline_s` (None: retry until `give_up`); an attempt in flight is bounded by its own
    timeout.
    """

    deadline_s: float | None = attrs.field(default=30.0, validator=_positive_or_none)
    pause_s: float = attrs.field(default=0.1, validator=positive)
    max_pause_s: float = attrs.field(default=1.0, validator=positive)

    def within(self, deadline_s: float | None) -> CallRetry:
        """The same pauses with another deadline (None: no deadline)."""
        return attrs.evolve(self, deadline_s=deadline_s)

    async def call(
        self,
        make: Callable[[], Awaitable[T]],
        *,
        what: str,
        give_up: Callable[[], bool] | None = None,
    ) -> T:
        """Await `make()` until it succeeds; raise its last error when retrying ends.

        `make` is called afresh for every attempt. nats-py errors it raises are mapped onto
        ours first; `what` names the call in the WARNING logged before each pause.

        Raises:
            TransientError: the call still failed at the deadline (or when `give_up()` said so).
            PermanentError: at once, on the first permanent failure.
        """
        # The first attempt runs bare: on the hot path (a result publish per chunk) building
        # the retry machinery for a call that succeeds cost a fifth of a node agent's CPU.
        started = time.monotonic()
        try:
            with nats_errors():
                return await make()
        except TransientError as exc:
            first: TransientError | None = exc
        # Imported only now, for a call that failed: a process whose calls all succeed at once
        # never loads tenacity (0.085 s of a worker's start on a 2-core machine).
        from tenacity import AsyncRetrying, retry_if_exception_type
        from tenacity.stop import stop_before_delay, stop_never
        from tenacity.wait import wait_random_exponential

        deadline_s = self.deadline_s
        if deadline_s is not None:
            deadline_s -= time.monotonic() - started
        past = stop_never if deadline_s is None else stop_before_delay(max(deadline_s, 0.0))

        def stop(state: RetryCallState) -> bool:
            # Past the deadline, or once `give_up()` says the caller no longer wants the result.
            return bool(past(state)) or (give_up is not None and give_up())

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(TransientError),
            stop=stop,
            wait=wait_random_exponential(multiplier=self.pause_s, max=self.max_pause_s),
            before_sleep=lambda state: _log_retry(what, state),
            reraise=True,
        )

        async def attempt() -> T:
            nonlocal first
            if first is not None:  # the bare attempt's failure, counted as attempt 1
                failed, first = first, None
                raise failed
            with nats_errors():
                return await make()

        return await retrying(attempt)


def _log_retry(what: str, state: RetryCallState) -> None:
    """One WARNING per pause, without a traceback: a retry is expected, not a failure."""
    error = state.outcome.exception() if state.outcome is not None else None
    log.warning(
        "retrying what=%s attempt=%d pause=%.3fs error=%s",
        what,
        state.attempt_number,
        state.upcoming_sleep,
        error,
    )
