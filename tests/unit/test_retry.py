"""broker/retry.py: RetryPolicy's deliveries, nak delays and JetStream backoff list."""

from __future__ import annotations

import pytest

from vramfabric.broker.retry import RetryPolicy


def test_defaults() -> None:
    policy = RetryPolicy()
    assert (policy.max_retries, policy.initial_backoff_s, policy.max_backoff_s) == (3, 1.0, 16.0)
    assert policy.max_deliver == 4


@pytest.mark.parametrize("retries", [0, 1, 5, 20])
def test_max_deliver_is_first_try_plus_retries(retries: int) -> None:
    assert RetryPolicy(max_retries=retries).max_deliver == retries + 1


def test_nak_delay_doubles_from_initial_and_caps_at_max() -> None:
    policy = RetryPolicy(max_retries=10, initial_backoff_s=1.0, max_backoff_s=16.0)
    delays = [policy.nak_delay_s(a) for a in range(1, 9)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 16.0, 16.0, 16.0]
    assert all(isinstance(d, float) for d in delays)


def test_nak_delay_cap_below_a_doubling_step() -> None:
    policy = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.nak_delay_s(a) for a in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]


def test_nak_delay_of_attempt_zero_is_the_initial_backoff() -> None:
    assert RetryPolicy(initial_backoff_s=2.0).nak_delay_s(0) == 2.0


def test_max_backoff_below_initial_caps_every_delay() -> None:
    policy = RetryPolicy(initial_backoff_s=10.0, max_backoff_s=4.0)
    assert policy.nak_delay_s(1) == 4.0


@pytest.mark.parametrize("retries", [0, 1, 3, 7, 30])
def test_backoff_has_one_entry_per_retry_fewer_than_max_deliver(retries: int) -> None:
    # JetStream rejects a consumer whose backoff list is not shorter than max_deliver.
    policy = RetryPolicy(max_retries=retries)
    backoff = policy.backoff_s(30.0)
    assert len(backoff) == retries
    assert len(backoff) < policy.max_deliver


def test_backoff_values_are_ack_wait_plus_nak_delay() -> None:
    policy = RetryPolicy(max_retries=6, initial_backoff_s=1.0, max_backoff_s=8.0)
    assert policy.backoff_s(30.0) == (31.0, 32.0, 34.0, 38.0, 38.0, 38.0)


def test_no_retries_means_empty_backoff() -> None:
    assert RetryPolicy(max_retries=0).backoff_s(30.0) == ()


def test_backoff_is_non_decreasing() -> None:
    backoff = RetryPolicy(max_retries=12, initial_backoff_s=0.25, max_backoff_s=60.0).backoff_s(5.0)
    assert list(backoff) == sorted(backoff)
    assert backoff[-1] == 65.0


def test_many_retries_stay_capped_at_max_backoff() -> None:
    policy = RetryPolicy(max_retries=1100)
    assert policy.nak_delay_s(1100) == policy.max_backoff_s
    assert policy.backoff_s(30.0)[-1] == 30.0 + policy.max_backoff_s


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_retries": -1}, "max_retries"),
        ({"initial_backoff_s": 0}, "initial_backoff_s must be > 0"),
        ({"initial_backoff_s": -1.0}, "initial_backoff_s must be > 0"),
        ({"max_backoff_s": 0.0}, "max_backoff_s must be > 0"),
    ],
)
def test_invalid_policies_are_rejected(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_is_frozen_and_comparable() -> None:
    assert RetryPolicy(max_retries=2) == RetryPolicy(max_retries=2)
    with pytest.raises(AttributeError):
        RetryPolicy().max_retries = 9  # type: ignore[misc]
