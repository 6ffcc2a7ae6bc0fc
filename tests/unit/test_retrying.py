"""broker/retrying.py: CallRetry retries transient failures only, with jitter, within a deadline.

Attempts are counted by the calls the policy really makes; pauses are read from the WARNING
it logs before each one (what an operator sees).
"""

from __future__ import annotations

import logging
import re
import time

import nats.errors
import pytest

from vramfabric.broker import errors as e
from vramfabric.broker.retrying import CallRetry
from vramfabric.broker.settings import BrokerSettings

FAST = CallRetry(deadline_s=5.0, pause_s=0.01, max_pause_s=0.04)
_PAUSE = re.compile(r"pause=([0-9.]+)s")


class Flaky:
    """A call that fails with `error` on its first `failures` calls, then returns "ok"."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures = failures
        self.error = error
        self.calls: list[float] = []

    async def __call__(self) -> str:
        """One attempt: fail the first `failures` times, then succeed."""
        self.calls.append(time.monotonic())
        if len(self.calls) <= self.failures:
            raise self.error
        return "ok"


def _pauses(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [
        float(m.group(1))
        for r in caplog.records
        if r.name == "vramfabric.broker.retrying" and (m := _PAUSE.search(r.getMessage()))
    ]


async def test_transient_failures_are_retried_with_jittered_pauses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a call that fails transiently six times
    caplog.set_level(logging.WARNING, "vramfabric.broker.retrying")
    call = Flaky(6, e.Disconnected("no leader"))
    # When it runs under the policy
    result = await FAST.call(call, what="publish")
    # Then it succeeds on the seventh call, after six logged pauses
    assert result == "ok"
    assert len(call.calls) == 7
    pauses = _pauses(caplog)
    assert len(pauses) == 6
    # each within its exponentially widening window (full jitter), never over the cap
    for n, pause in enumerate(pauses, start=1):
        assert 0.0 <= pause <= min(FAST.max_pause_s, FAST.pause_s * 2 ** (n - 1)) + 1e-3
    # and not in lockstep: the draws differ
    assert len(set(pauses)) > 1
    assert all("what=publish" in r.getMessage() for r in caplog.records)


async def test_nats_py_transient_errors_are_mapped_and_retried() -> None:
    # Given a call failing as nats-py does while a node starts: no responders, then a timeout
    errors = [nats.errors.NoRespondersError(), nats.errors.TimeoutError()]
    calls = 0

    async def request() -> str:
        nonlocal calls
        calls += 1
        if errors:
            raise errors.pop(0)
        return "granted"

    # When it runs under the policy, then both failures were retried
    assert await FAST.call(request, what="lease acquire") == "granted"
    assert calls == 3


async def test_no_attempt_starts_after_the_deadline() -> None:
    # Given a call that always fails transiently, and a short deadline
    policy = CallRetry(deadline_s=0.3, pause_s=0.01, max_pause_s=0.05)
    call = Flaky(10_000, nats.errors.NoRespondersError())
    started = time.monotonic()
    # When it runs under the policy
    with pytest.raises(e.Disconnected) as info:
        await policy.call(call, what="connect")
    # Then it was tried several times, every try began before the deadline (give or take
    # the event loop's lateness on a loaded machine: a pause may end late, never start one
    # that ends past the deadline), and the last error surfaced as ours, caused by nats-py's
    assert len(call.calls) > 2
    assert all(t - started < 0.3 + 0.2 for t in call.calls)
    assert time.monotonic() - started < 0.3 + 0.7
    assert isinstance(info.value.__cause__, nats.errors.NoRespondersError)


@pytest.mark.parametrize(
    "error",
    [
        e.PermissionDenied("publish to vf.work.b.j1 not allowed"),
        e.PermanentError("jetstream error: bad request"),
        e.InvalidMessage("LeaseGrant", "bad msgpack"),
    ],
    ids=lambda x: type(x).__name__,
)
async def test_permanent_errors_surface_at_once(
    error: e.VramfabricError, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a call that fails permanently
    caplog.set_level(logging.WARNING, "vramfabric.broker.retrying")
    call = Flaky(10_000, error)
    # When it runs under the policy, then the same error is raised after one call
    with pytest.raises(type(error)) as info:
        await FAST.call(call, what="publish")
    assert info.value is error
    assert len(call.calls) == 1
    assert _pauses(caplog) == []


async def test_a_nats_permission_violation_is_permission_denied_at_once() -> None:
    call = Flaky(10_000, nats.errors.Error('nats: permissions violation for publish to "vf.x"'))
    with pytest.raises(e.PermissionDenied):
        await FAST.call(call, what="publish")
    assert len(call.calls) == 1


@pytest.mark.parametrize(
    "bug",
    [TypeError("unsupported operand"), KeyError("lease_id"), AttributeError("no .js")],
    ids=lambda x: type(x).__name__,
)
async def test_programming_errors_surface_at_once_unchanged(bug: Exception) -> None:
    # Given a call with a bug in it
    call = Flaky(10_000, bug)
    # When it runs under the policy, then the bug itself (not our root error) is raised once
    with pytest.raises(type(bug)) as info:
        await FAST.call(call, what="renew")
    assert info.value is bug
    assert not isinstance(info.value, e.VramfabricError)
    assert len(call.calls) == 1


async def test_give_up_ends_retrying_with_the_last_transient_error() -> None:
    # Given a call that always fails transiently, no deadline, and a caller that stops
    call = Flaky(10_000, e.Disconnected("no leader"))
    policy = FAST.within(None)
    # When the caller says to give up after the third call
    with pytest.raises(e.Disconnected):
        await policy.call(call, what="resubscribe", give_up=lambda: len(call.calls) >= 3)
    # Then no fourth call was made
    assert len(call.calls) == 3


def test_within_keeps_the_pauses_and_sets_the_deadline() -> None:
    policy = CallRetry(deadline_s=30.0, pause_s=0.2, max_pause_s=2.0).within(5.0)
    assert policy == CallRetry(deadline_s=5.0, pause_s=0.2, max_pause_s=2.0)


@pytest.mark.parametrize("field", ["deadline_s", "pause_s", "max_pause_s"])
def test_pauses_and_deadlines_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CallRetry(**{field: 0.0})


def test_broker_settings_build_the_policy_from_the_environment() -> None:
    settings = BrokerSettings.from_env(
        {
            "VRAMFABRIC_RETRY_DEADLINE_S": "12",
            "VRAMFABRIC_RETRY_PAUSE_S": "0.2",
            "VRAMFABRIC_RETRY_MAX_PAUSE_S": "3",
        }
    )
    assert settings.call_retry == CallRetry(deadline_s=12.0, pause_s=0.2, max_pause_s=3.0)
    assert BrokerSettings.from_env({}).call_retry == CallRetry()


def test_a_bad_retry_setting_names_the_variable() -> None:
    with pytest.raises(ValueError, match="VRAMFABRIC_RETRY_DEADLINE_S"):
        BrokerSettings.from_env({"VRAMFABRIC_RETRY_DEADLINE_S": "soon"})
