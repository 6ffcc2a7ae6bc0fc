"""Wire types of packing: several tiny chunks in one work message, and their one result.

See docs/protocol.md, Packing. Like every wire type, frozen attrs classes (codec.py).
"""

from __future__ import annotations

from typing import Any

import attrs

from .messages import PROTOCOL_VERSION, ChunkResult
from .subjects import MAX_PACK_CHUNKS, token

_ge0 = attrs.validators.ge(0)


def _is_token(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    token(value, attr.name)


def _is_pack_outcome(inst: PackResult, _attr: attrs.Attribute[Any], value: Any) -> None:
    """Every chunk of the pack has one outcome: an inline output, or one of `others`."""
    n = len(inst.outputs)
    if not 1 <= n <= MAX_PACK_CHUNKS:
        raise ValueError(f"a pack holds 1 to {MAX_PACK_CHUNKS} chunks, not {n}")
    if not inst.others:  # the common case, checked without a call per chunk
        if None in inst.outputs:
            raise ValueError("`others` must hold exactly the chunks whose output is None")
        return
    missing = {inst.first + i for i, out in enumerate(inst.outputs) if out is None}
    listed = [r.index for r in inst.others]
    if sorted(listed) != sorted(missing) or len(set(listed)) != len(listed):
        raise ValueError("`others` must hold exactly the chunks whose output is None")
    if any(r.job != inst.job for r in inst.others):
        raise ValueError("a result in `others` names another job")


@attrs.frozen
class ChunkPack:
    """Chunks `first`, `first + 1`, ... of `job` in one message, each with its own input.

    Tiny chunks travel packed so that a job of them is not bound by the per-message cost;
    each chunk keeps its index (its id), and the pack's result holds one outcome per chunk.
    """

    job: str = attrs.field(validator=_is_token)
    first: int = attrs.field(validator=_ge0)
    inputs: tuple[bytes, ...] = attrs.field(
        validator=[attrs.validators.min_len(1), attrs.validators.max_len(MAX_PACK_CHUNKS)]
    )
    v: int = PROTOCOL_VERSION

    @property
    def last(self) -> int:
        """The index of the pack's last chunk."""
        return self.first + len(self.inputs) - 1


@attrs.frozen
class PackResult:
    """The outcomes of a pack's chunks `first` .. `first + len(outputs) - 1`, in order.

    `outputs[i]` is chunk `first + i`'s output when it succeeded with an output small enough
    to travel here; otherwise it is None and the chunk's full `ChunkResult` (a failure, an
    output in the outputs store, or a chunk retried alone that succeeded on a later attempt
    than the pack's) is in `others`. The rest describes the pack's run.
    """

    job: str = attrs.field(validator=_is_token)
    first: int = attrs.field(validator=_ge0)
    outputs: tuple[bytes | None, ...]
    others: tuple[ChunkResult, ...] = attrs.field(default=(), validator=_is_pack_outcome)
    attempt: int = 1
    node: str = ""
    lease_id: str = ""
    started_at: float = 0.0
    elapsed_s: float = 0.0
    v: int = PROTOCOL_VERSION
    # What running the pack's chunks cost on its node (see ChunkResult.cost_s).
    cost_s: float = 0.0

    @property
    def last(self) -> int:
        """The index of the pack's last chunk."""
        return self.first + len(self.outputs) - 1
