"""Every subject, stream, bucket, consumer and header name of the protocol, and nothing else.

`Subjects(prefix)` builds them all from one prefix, so tests can share one server under unique
prefixes. Wildcards come only from methods named `*_filter`, which keeps them out of publishes.
docs/protocol/names.md mirrors this package and a test holds the two together. The names are
grouped by concept: flows.py (the core subjects), jetstream.py (streams, buckets, keys),
accounts.py (imports between accounts), msg_ids.py (dedup ids), tokens.py (what all are
built from).
"""

from __future__ import annotations

import attrs

from .accounts import AccountNames
from .flows import FlowSubjects
from .jetstream import JetStreamNames
from .msg_ids import MessageIds
from .tokens import (
    HEADER_MSG_ID,
    INTERACTIVE_JOB_PREFIX,
    JS_API,
    LEASE_OPS,
    MAX_PACK_CHUNKS,
    check_prefix,
    token,
)

__all__ = [
    "HEADER_MSG_ID",
    "INTERACTIVE_JOB_PREFIX",
    "JS_API",
    "LEASE_OPS",
    "MAX_PACK_CHUNKS",
    "Subjects",
    "token",
]


@attrs.frozen
class Subjects(FlowSubjects, JetStreamNames, AccountNames, MessageIds):
    """The names of one fabric, all derived from `prefix` (default `vf`)."""

    prefix: str = attrs.field(default="vf", validator=lambda _i, _a, v: check_prefix(v))
