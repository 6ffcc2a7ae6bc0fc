"""A pack's chunks inside an executor: run one after another, each with its own outcome.

The work is resolved once for the whole pack (work_runner.py, `WorkRunner.bind`); each
chunk gets its own context and its own outcome (worker/executor/ipc.py, `Outcome`). A
Python function that takes no context runs the pack's inputs in one loop instead
(`WorkRunner.bind_run`), with the same outcomes. A failed chunk's outcome carries what the
pack printed since the previous failure in it (or its start): marking each chunk's start
would cost a tiny chunk more than its own work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vramfabric.broker.errors import ErrorKind
from vramfabric.kernels.code import Context

from . import ipc
from .captured import TAIL_BYTES, Captured
from .work_runner import Failure, WorkRunner, full_traceback, is_cuda_error, summary

# What a pack's failed chunks keep of what they printed, shared (each keeps at least the min):
# the pack's result keeps less still (worker/chunks/pack_runner.py).
PACK_TAIL_BYTES, PACK_TAIL_MIN_BYTES = 2**20, 4 * 2**10


def run_pack(runner: WorkRunner, captured: Captured, frame: ipc.Run, printed_from: int) -> bytes:
    """Run a pack frame's chunks one after another; their outcomes, each its own.

    A CUDA error is raised (the whole process is suspect: the caller reports it and exits).
    """
    inputs = frame.inputs or ()
    tail_bytes = max(PACK_TAIL_MIN_BYTES, min(TAIL_BYTES, PACK_TAIL_BYTES // len(inputs)))
    try:
        many = runner.bind_run(frame)
        run = runner.bind(frame) if many is None else None
        wants_context = many is None and runner.wants_context(frame)
    except Exception as exc:  # recorded: every chunk's outcome names it
        if is_cuda_error(exc):
            raise
        return ipc.pack_outcomes([failed(exc)] * len(inputs))
    if many is not None:
        return ipc.pack_outcomes(_run_many(many, inputs, captured, printed_from, tail_bytes))
    assert run is not None
    gpu, slice_bytes = runner.gpu, frame.slice_bytes
    attempt, job = frame.attempt, frame.job
    outcomes: list[ipc.Outcome] = []
    ctx = None  # made per chunk only for work that reads it: it costs more than a tiny chunk
    for index, data in enumerate(inputs, frame.index):
        # A packed chunk is short and a redelivered pack starts afresh: its checkpoints
        # are not kept (one KV write per tiny chunk would cost more than the chunk).
        if wants_context:
            ctx = Context(
                gpu, slice_bytes, runner.array_module, attempt, job, index, None, _discard
            )
        try:
            outcomes.append(run(data, ctx))
        except Exception as exc:  # recorded: this chunk's outcome names it
            if is_cuda_error(exc):
                raise
            outcomes.append(failed(exc, captured.tail(printed_from, tail_bytes)))
            printed_from = captured.mark()
    return ipc.pack_outcomes(outcomes)


def _run_many(
    many: Callable[[Sequence[bytes], list[bytes]], None],
    inputs: Sequence[bytes],
    captured: Captured,
    printed_from: int,
    tail_bytes: int,
) -> list[ipc.Outcome]:
    """The outcomes of a pack's chunks run by one loop (`WorkRunner.bind_run`).

    The loop stops at a chunk that fails: its failure takes its place and the loop goes on
    from the next chunk.
    """
    outcomes: list[ipc.Outcome] = []
    while len(outcomes) < len(inputs):
        try:
            many(inputs, outcomes)  # type: ignore[arg-type]  # appends outputs only
        except Exception as exc:  # recorded: the chunk's outcome names it
            outcomes.append(failed(exc, captured.tail(printed_from, tail_bytes)))
            printed_from = captured.mark()
    return outcomes


def failed(exc: Exception, printed: str = "") -> ipc.Outcome:
    """A chunk's outcome for what its work raised (unexpected ones are permanent)."""
    if isinstance(exc, Failure):
        return (False, exc.kind.value, str(exc), printed, "")
    return (False, ErrorKind.ERROR.value, summary(exc), printed, full_traceback(exc))


def _discard(_state: bytes) -> None:
    """A packed chunk's checkpoint: not stored."""
