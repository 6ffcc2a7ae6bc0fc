"""The protocol's name tokens and fixed names: what every name of broker/subjects/ is built from."""

from __future__ import annotations

import re

TOKEN = re.compile(r"[A-Za-z0-9_-]+")
# Chunks per packed message (ChunkPack, PackResult) at most: a pack is retried whole, and the
# result of a pack whose every chunk failed still fits the server's 1 MiB payload (each
# failure, its texts shortened, takes about 420 bytes of it: test_pack_texts.py). A node
# says how many it takes (NodeAdvert.max_pack_chunks): nodes of older versions, 1,000.
MAX_PACK_CHUNKS = 2000
# A chunk index as `result()` writes it: ASCII digits, no sign, no leading zero, and short
# enough to be an int64 (int() of a huge string raises, and `²` passes `str.isdigit`).
INDEX = re.compile(r"0|[1-9][0-9]{0,17}")

HEADER_MSG_ID = "Nats-Msg-Id"

LEASE_OPS = ("acquire", "renew", "release", "held")

# Leases held for interactive calls (`fabric.gpu()`) carry a job name with this prefix: no
# job, consumer or spec exists for them, so nodes start no puller.
INTERACTIVE_JOB_PREFIX = "_gpu_"

# The JetStream API of a client's own account.
JS_API = "$JS.API"


def token(value: str, what: str = "token") -> str:
    """Return `value` if it is a safe subject token, else raise ValueError naming `what`."""
    # fullmatch: `$` would let a trailing newline through into a protocol line.
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} is not a subject token (letters, digits, '_' and '-' only)"
        )
    return value


def check_prefix(value: str) -> None:
    """Raise ValueError unless `value` is a lower-case token (a fabric's prefix)."""
    # Stream names carry the prefix upper-cased: `vf` and `VF` must not share streams.
    if token(value, "prefix") != value.lower():
        raise ValueError(f"prefix {value!r} must be lower case")
