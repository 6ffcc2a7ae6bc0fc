"""Frames between the node agent and its executor processes: length-prefixed msgpack maps.

msgpack, never pickle, in both directions: an executor runs users' code, and the agent must
not unpickle anything such code could have written. Every frame is a map with an `op`:

| op | from | fields |
| --- | --- | --- |
| `ready` | executor | `python` |
| `load` | agent | `digest`, `kind` (`python` or `cuda`), `blob` |
| `run` | agent | `task`, `kind`, `name`, `digest`, `args`, `input`, `slice_bytes`, |
| | | `lease`, `attempt`, `job`, `index`, `resumed`; a pack has `inputs` (chunks |
| | | `index`, `index + 1`, ...) instead of `input` |
| `done` | executor | `task`, `ok`, `output` and `cost_s` (the seconds the work ran in its |
| | | thread), or `kind` + `error` + `printed` (the end of what it printed) and, for an |
| | | unexpected exception, `traceback`; a pack's `output` is its outcomes (`pack_outcomes`) |
| `checkpoint` | executor | `task`, `state` |
| `checkpointed` | agent | `task`, `error` (None when stored) |
| `lease_ended` | agent | `leases`: ids of leases that ended (on a GPU, their streams and |
| | | memory pools go: lease_devices.py) |
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

_LENGTH = struct.Struct("<I")
# A frame carries at most one chunk's input or output plus a little: refuse anything larger.
MAX_FRAME_BYTES = 256 * 2**20
# A checkpoint is stored in one KV value: well below the server's max payload.
MAX_CHECKPOINT_BYTES = 512 * 2**10


def pack(frame: dict[str, Any]) -> bytes:
    """One frame: its length, then the msgpack map."""
    body: bytes = msgpack.packb(frame, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


def length_of(header: bytes) -> int:
    """The body length a 4-byte header announces; ValueError past the frame limit."""
    (n,) = _LENGTH.unpack(header)
    if n > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {n} bytes exceeds {MAX_FRAME_BYTES}")
    return int(n)


def unpack(body: bytes) -> dict[str, Any]:
    """A frame's map; ValueError if it is not one."""
    frame = msgpack.unpackb(body, raw=False)
    if not isinstance(frame, dict) or not isinstance(frame.get("op"), str):
        raise ValueError("frame is not a map with an op")
    return frame


HEADER_BYTES = _LENGTH.size


# One chunk's outcome inside a pack: (True, output) or (False, error kind, message, what it
# printed, traceback).
Outcome = tuple[bool, bytes] | tuple[bool, str, str, str, str]


def pack_outcomes(outcomes: list[Outcome]) -> bytes:
    """A pack's outcomes, in chunk order, as the `output` of its `done` frame."""
    return msgpack.packb(outcomes, use_bin_type=True)  # type: ignore[no-any-return]


def unpack_outcomes(output: bytes, n_chunks: int) -> list[Outcome]:
    """The outcomes `pack_outcomes` wrote; ValueError unless there is one per chunk."""
    outcomes = msgpack.unpackb(output, raw=False, use_list=False)
    if not isinstance(outcomes, tuple) or len(outcomes) != n_chunks:
        raise ValueError(f"a pack of {n_chunks} chunks came back with another count")
    return list(outcomes)
