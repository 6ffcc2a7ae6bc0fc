"""What every wire type shares: the protocol version and the field validators."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..subjects import token

PROTOCOL_VERSION = 1

ge0 = attrs.validators.ge(0)
# Typed for any number: inferred from `gt(0)` it would accept int fields only.
gt0: Callable[[Any, attrs.Attribute[Any], Any], Any] = attrs.validators.gt(0)


def is_token(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    """Attrs validator: the field is a safe subject token (it becomes part of a subject)."""
    token(value, attr.name)
