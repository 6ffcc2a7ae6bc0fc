"""UidRange: the uids a node's executors may run as (`VRAMFABRIC_EXECUTOR_UIDS`).

A setting of the node (node/settings.py reads it); executors/containment.py picks each
tenant's uid in it.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class UidRange:
    """Uids `first..last` (inclusive) that executors may run as."""

    first: int = attrs.field(validator=attrs.validators.gt(0))
    last: int = attrs.field(validator=attrs.validators.lt(2**32 - 1))

    def __attrs_post_init__(self) -> None:
        if self.last < self.first:
            raise ValueError(f"uid range {self.first}-{self.last} is empty")

    @property
    def size(self) -> int:
        """How many uids the range holds."""
        return self.last - self.first + 1

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    @classmethod
    def parse(cls, text: str) -> UidRange:
        """Parse `FIRST-LAST`, e.g. `20000-20999`; ValueError saying what is wrong."""
        first, sep, last = text.strip().partition("-")
        if not sep or not first.strip().isdigit() or not last.strip().isdigit():
            raise ValueError(f"{text!r} is not a uid range FIRST-LAST such as 20000-20999")
        try:
            return cls(int(first), int(last))
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc} (uids 1 to 4294967294, FIRST <= LAST)") from None


# Root's default: above useradd's UID_MAX (60000) and systemd-homed's 60001-60513, below
# systemd's DynamicUser 61184-65519, and under 65536 so containers mapping 64Ki uids work.
DEFAULT_UIDS = UidRange(60600, 61183)
