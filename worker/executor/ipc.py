"""Frames between the node agent and its executor processes: typed, length-prefixed msgpack.

msgpack, never pickle, in both directions: an executor runs users' code, and the agent must
not unpickle anything such code could have written. Each frame is a frozen attrs class
below; on the pipe it is a 4-byte little-endian length, then one msgpack map of its fields
and its `op` (`encode`, `decode`: this module alone turns frames into bytes and back).

| op | class | from | fields |
| --- | --- | --- | --- |
| `ready` | Ready | executor | `python` |
| `load` | Load | agent | `digest`, `kind` (`python` or `cuda`), `blob` |
| `run` | Run | agent | `task`, `kind`, `name`, `digest`, `args`, `input`, `slice_bytes`, |
| | | | `lease`, `attempt`, `job`, `index`, `resumed`; a pack has `inputs` (chunks |
| | | | `index`, `index + 1`, ...) instead of `input` |
| `done` | Done | executor | `task`, `ok`, `output` and `cost_s` (the seconds the work ran in |
| | | | its thread), or `kind` + `error` + `printed` (the end of what it printed) and, |
| | | | for an unexpected exception, `traceback`; a pack's `output` is its outcomes |
| | | | (`pack_outcomes`: each chunk's output, or its failure) |
| `checkpoint` | Checkpoint | executor | `task`, `state` |
| `checkpointed` | Checkpointed | agent | `task`, `error` (None when stored) |
| `lease_ended` | LeaseEnded | agent | `leases`: ids of leases that ended (on a GPU, their |
| | | | streams and memory pools go: lease_devices.py) |
"""

from __future__ import annotations

import operator
import struct
from typing import Any

import attrs
import msgpack

_LENGTH = struct.Struct("<I")
# A frame carries at most one chunk's input or output plus a little: refuse anything larger.
MAX_FRAME_BYTES = 256 * 2**20
# A checkpoint is stored in one KV value: well below the server's max payload.
MAX_CHECKPOINT_BYTES = 512 * 2**10


def length_of(header: bytes) -> int:
    """The body length a 4-byte header announces; ValueError past the frame limit."""
    (n,) = _LENGTH.unpack(header)
    if n > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {n} bytes exceeds {MAX_FRAME_BYTES}")
    return int(n)


HEADER_BYTES = _LENGTH.size


def _tuple(items: Any) -> tuple[Any, ...]:
    return tuple(items)


def _tuple_or_none(items: Any) -> tuple[Any, ...] | None:
    return None if items is None else tuple(items)


@attrs.frozen(kw_only=True)
class Ready:
    """The executor is up: its first frame."""

    python: str


@attrs.frozen(kw_only=True)
class Load:
    """An uploaded work's blob, sent once per process before the first chunk that runs it."""

    digest: str
    kind: str
    blob: bytes


@attrs.frozen(kw_only=True)
class Run:
    """One chunk (or one pack: `inputs`) to run on a thread of its own.

    The chunk's side (`args`, `input` or `inputs`, `attempt`, `job`, `index`, `resumed`) is
    its runner's; the pool fills in the task, the work and the lease (`ExecutorPool.run`).
    """

    job: str
    index: int
    attempt: int
    args: dict[str, Any] = attrs.field(factory=dict)
    input: bytes | None = None
    inputs: tuple[bytes, ...] | None = attrs.field(default=None, converter=_tuple_or_none)
    # The pickled checkpoint of an earlier delivery of the chunk, if any.
    resumed: bytes | None = None
    task: int = -1
    kind: str = ""
    name: str = ""
    digest: str = ""
    slice_bytes: int = 0
    lease: str = ""

    def placed(
        self, task: int, kind: str, name: str, digest: str, slice_bytes: int, lease: str
    ) -> Run:
        """This chunk's frame as task `task` of a work on a lease.

        Made directly, not by `attrs.evolve`: a frame is made per chunk, and evolve costs
        several times more.
        """
        return Run(
            job=self.job,
            index=self.index,
            attempt=self.attempt,
            args=self.args,
            input=self.input,
            inputs=self.inputs,
            resumed=self.resumed,
            task=task,
            kind=kind,
            name=name,
            digest=digest,
            slice_bytes=slice_bytes,
            lease=lease,
        )


@attrs.frozen(kw_only=True)
class Done:
    """A chunk's (or a pack's) outcome: its output, or why it failed."""

    task: int
    ok: bool
    output: bytes = b""
    cost_s: float = 0.0
    kind: str = ""
    error: str = ""
    printed: str = ""
    traceback: str = ""


@attrs.frozen(kw_only=True)
class Checkpoint:
    """A running chunk's state to store; the chunk waits for `Checkpointed`."""

    task: int
    state: bytes


@attrs.frozen(kw_only=True)
class Checkpointed:
    """The checkpoint of `task` was stored (`error` None), or why not."""

    task: int
    error: str | None = None


@attrs.frozen(kw_only=True)
class LeaseEnded:
    """These leases ended: their devices' streams and pools may go."""

    leases: tuple[str, ...] = attrs.field(converter=_tuple)


Frame = Ready | Load | Run | Done | Checkpoint | Checkpointed | LeaseEnded
_OP_OF: dict[type[Any], str] = {
    Ready: "ready",
    Load: "load",
    Run: "run",
    Done: "done",
    Checkpoint: "checkpoint",
    Checkpointed: "checkpointed",
    LeaseEnded: "lease_ended",
}
_CLASS_OF = {op: cls for cls, op in _OP_OF.items()}
# Each class's field names and a getter of their values, made once (a frame is encoded per
# chunk).
_FIELDS = {cls: tuple(f.name for f in attrs.fields(cls)) for cls in _OP_OF}
_VALUES = {cls: operator.attrgetter(*names) for cls, names in _FIELDS.items()}


def encode(frame: Frame) -> bytes:
    """One frame's bytes: its length, then the msgpack map of its op and fields."""
    cls = type(frame)
    values = _VALUES[cls](frame)
    fields = dict(zip(_FIELDS[cls], values if len(_FIELDS[cls]) > 1 else (values,), strict=True))
    fields["op"] = _OP_OF[cls]
    body: bytes = msgpack.packb(fields, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


def decode(body: bytes) -> Frame:
    """The frame a body (after its length) holds; ValueError if it is not one."""
    raw = msgpack.unpackb(body, raw=False)
    if not isinstance(raw, dict) or not isinstance(raw.get("op"), str):
        raise ValueError("frame is not a map with an op")
    cls = _CLASS_OF.get(raw.pop("op"))
    if cls is None:
        raise ValueError("frame has an unknown op")
    try:
        frame: Frame = cls(**raw)
    except TypeError as exc:  # a field missing or unknown
        raise ValueError(f"bad {_OP_OF[cls]} frame: {exc}") from None
    return frame


# One chunk's outcome inside a pack: its output (it succeeded), or (False, error kind,
# message, what it printed, traceback).
Outcome = bytes | tuple[bool, str, str, str, str]


def pack_outcomes(outcomes: list[Outcome]) -> bytes:
    """A pack's outcomes, in chunk order, as the `output` of its `done` frame.

    An output is itself, not wrapped: a pack of tiny chunks that all succeeded is read back
    without a call per chunk (`unpack_outcomes`, `all_outputs`).
    """
    return msgpack.packb(outcomes, use_bin_type=True)  # type: ignore[no-any-return]


def unpack_outcomes(output: bytes, n_chunks: int) -> list[Outcome]:
    """The outcomes `pack_outcomes` wrote; ValueError unless there is one per chunk."""
    outcomes = msgpack.unpackb(output, raw=False, use_list=False)
    if not isinstance(outcomes, tuple) or len(outcomes) != n_chunks:
        raise ValueError(f"a pack of {n_chunks} chunks came back with another count")
    return list(outcomes)


def all_outputs(outcomes: list[Outcome]) -> bool:
    """Whether every outcome is an output (every chunk succeeded), checked at once."""
    return set(map(type, outcomes)) == {bytes}
