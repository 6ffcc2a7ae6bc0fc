"""worker/executor/: a pack's chunks run in one frame, each with its own outcome and context."""

from __future__ import annotations

import argparse
import io
import pickle
from typing import Any

from vramfabric.coordinator.jobs.work import job_work
from vramfabric.kernels.code import Context, encode_input
from vramfabric.worker.executor import ipc
from vramfabric.worker.executor.process import Executor


def index_or_fail(x: int, ctx: Context) -> tuple[int, int, str]:
    """Each chunk's own index and job from its context; input 3 raises."""
    if x == 3:
        raise ArithmeticError("three is refused")
    return x * 10, ctx.index, ctx.job


def _outcomes(executor: Executor, frame: ipc.Run) -> list[tuple[Any, ...]]:
    """What the agent reads back from a pack's frame: one outcome per chunk."""
    n_chunks = len(frame.inputs or ())
    outcomes = ipc.unpack_outcomes(executor._run_pack(frame), n_chunks)
    return [(True, o) if isinstance(o, bytes) else tuple(o) for o in outcomes]


def _executor() -> Executor:
    args = argparse.Namespace(kernel_module=[], simulated=True, slots=1)
    return Executor(args, io.BytesIO())


def _frame(digest: str, inputs: list[bytes], first: int = 40) -> ipc.Run:
    return ipc.Run(
        task=1,
        kind="python",
        name="fn",
        digest=digest,
        inputs=tuple(inputs),
        index=first,
        attempt=1,
        job="jobp",
        slice_bytes=2**20,
        lease="l1",
    )


def test_each_packed_chunk_gets_its_own_output_context_and_failure() -> None:
    work = job_work(index_or_fail)
    assert work.blob is not None
    executor = _executor()
    executor.runner.add_blob(work.digest, work.blob)
    inputs = [encode_input(x) for x in range(5)]
    outcomes = _outcomes(executor, _frame(work.digest, inputs))
    ok = {i: pickle.loads(o[1]) for i, o in enumerate(outcomes) if o[0]}
    # Chunk 40 + i ran with index 40 + i; only the chunk whose input raised failed.
    assert ok == {i: (i * 10, 40 + i, "jobp") for i in (0, 1, 2, 4)}
    failed = outcomes[3]
    assert failed[0] is False and failed[1] == "error"
    assert "ArithmeticError: three is refused" in str(failed[2])


def test_a_pack_whose_work_cannot_load_fails_every_chunk_with_the_reason() -> None:
    executor = _executor()
    inputs = [encode_input(x) for x in range(3)]
    outcomes = _outcomes(executor, _frame("ab" * 32, inputs))
    for outcome in outcomes:
        assert outcome[:2] == (False, "load_failed")
        assert "never loaded" in str(outcome[2])


def square_or_fail(x: int) -> object:
    """A function of no context (run in one loop): 2 raises, 4 is too big."""
    if x == 2:
        raise ValueError("two is refused")
    return "y" * 500 if x == 4 else x * x


def test_a_pack_run_in_one_loop_gives_each_chunk_its_outcome_in_order() -> None:
    # Given a function that takes no ctx, an output limit of 100 bytes, and a pack of six
    work = job_work(square_or_fail, max_output_bytes=100)
    assert work.blob is not None
    executor = _executor()
    executor.runner.add_blob(work.digest, work.blob)
    inputs = [encode_input(x) for x in range(6)]
    # When the pack runs
    outcomes = _outcomes(executor, _frame(work.digest, inputs))
    # Then the chunks before, between and after the failures have their outputs, in order
    assert [pickle.loads(o[1]) for i, o in enumerate(outcomes) if i not in (2, 4)] == [
        0,
        1,
        9,
        25,
    ]
    assert all(o[0] is True for i, o in enumerate(outcomes) if i not in (2, 4))
    # And each failure is its own: the raise with its traceback, the output over the limit
    assert outcomes[2][:2] == (False, "error") and "two is refused" in str(outcomes[2][2])
    assert "square_or_fail" in str(outcomes[2][4])
    assert outcomes[4][:2] == (False, "launch_failed")
    assert "exceeds max_output_bytes=100" in str(outcomes[4][2])
