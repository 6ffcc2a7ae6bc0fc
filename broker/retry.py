"""RetryPolicy: how often and how late a chunk is retried, mapped onto JetStream's consumer."""

from __future__ import annotations

import attrs


def positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    """Validate that the field is > 0 (an attrs validator; the message names the field)."""
    if value <= 0:
        raise ValueError(f"{attr.name} must be > 0, got {value}")


@attrs.frozen
class RetryPolicy:
    """Retries of a chunk after transient failures, with exponential backoff.

    It travels inside the JobSpec (workers read it to pick `nak` delays and to know the last
    delivery), so it lives in broker/ rather than coordinator/.
    """

    max_retries: int = attrs.field(
        default=3, validator=[attrs.validators.ge(0), attrs.validators.le(10_000)]
    )
    initial_backoff_s: float = attrs.field(default=1.0, validator=positive)
    max_backoff_s: float = attrs.field(default=16.0, validator=positive)

    @property
    def max_deliver(self) -> int:
        """Deliveries JetStream makes of one chunk: the first try plus the retries."""
        return self.max_retries + 1

    def nak_delay_s(self, attempt: int) -> float:
        """Delay before redelivery after the given (1-based) attempt failed transiently."""
        # Cap the exponent first: 2**1100 would overflow a float.
        doublings = min(max(0, attempt - 1), 64)
        return float(min(self.max_backoff_s, self.initial_backoff_s * 2.0**doublings))

    def backoff_s(self, ack_wait_s: float) -> tuple[float, ...]:
        """Ack deadlines per delivery for `ConsumerConfig.backoff` (empty: use ack_wait alone).

        A silent holder (a dead worker) is given `ack_wait_s` and then the policy's backoff,
        so a crash loop backs off like an explicit transient failure does. JetStream wants
        fewer entries than `max_deliver`, and `backoff[0]` replaces `ack_wait` as the first
        ack deadline (so that deadline is `ack_wait_s` plus the first backoff).
        """
        return tuple(ack_wait_s + self.nak_delay_s(a) for a in range(1, self.max_retries + 1))
