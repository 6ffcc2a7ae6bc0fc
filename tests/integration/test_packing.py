"""Tiny chunks packed several to a message: each keeps its own outcome, folded exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.js.errors import NotFoundError

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory, WorkerProcess
from tests.kernels_for_tests import SLEEPY, executions, sleepy_input
from vramfabric.broker import BrokerSettings, Connection, ErrorKind, RetryPolicy, encode
from vramfabric.broker.packs import PackResult
from vramfabric.broker.subjects import HEADER_MSG_ID
from vramfabric.coordinator import ArgMin, Fabric, Fold, Gather, Job
from vramfabric.coordinator.jobs.joblist import count_results, inspect

CodeFabric = Callable[..., Awaitable[Fabric]]


@pytest_asyncio.fixture
async def code_fabric(agent_factory: AgentFactory, fabric_factory: FabricFactory) -> CodeFabric:
    """A node that runs Python functions (4 slices), and a fabric made with the given settings."""
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    return fabric_factory


def square_loss(x: int) -> float:
    """A tiny chunk: the loss of configuration `x` (smallest at 1234)."""
    return float((x - 1234) ** 2)


def fails_on_sevens(x: int) -> int:
    """Fails the chunks whose input ends in 7; the others return their input."""
    if x % 10 == 7:
        raise ValueError(f"no sevens: {x}")
    return x


def fails_until_flag(item: tuple[int, str]) -> int:
    """Fails the chunks whose input ends in 3 until the file named beside it exists."""
    x, flag = item
    if x % 10 == 3 and not Path(flag).exists():
        raise RuntimeError(f"{x}: not yet")
    return x


def hangs_on_five(x: int) -> int:
    """Hangs on input 5 (its deadline kills it); returns the others at once."""
    if x == 5:
        import time

        time.sleep(60)  # stands in for a chunk that hangs
    return x


async def result_subjects(conn: Connection, broker: BrokerSettings, job_id: str) -> list[str]:
    """The job's result subjects in the results stream."""
    info = await conn.js.stream_info(
        broker.subjects.results_stream("default"),
        subjects_filter=broker.subjects.result_filter("default", job_id),
    )
    return list(info.state.subjects or {})


def every_chunk_once() -> Fold:
    """Counts how often each chunk's output is folded."""
    return Fold(lambda seen, i, _out: seen + Counter({i: 1}), Counter())


async def test_tiny_chunks_travel_packed_and_each_is_folded_once(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
) -> None:
    # Given two nodes that run code, and a job of 3000 tiny chunks (auto packing, the default)
    for node in ("n1", "n2"):
        await agent_factory(node, simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    job = Job(square_loss, list(range(3000)))
    # When it runs
    result = await fabric.run(job, ArgMin(), slices=4)
    # Then every chunk has its own result, the argmin is the expected chunk ...
    assert (result.n_ok, result.n_failed) == (3000, 0)
    assert result.value[0] == 1234
    # ... and most chunks travelled packed: far fewer result messages than chunks, named
    # by the first and last chunk they hold
    subjects = await result_subjects(conn, broker, result.job_id)
    packs = [s for s in subjects if s.count(".") == 5]
    assert packs and len(subjects) < 3000 // 4
    covered = sum(int(s.split(".")[-1]) - int(s.split(".")[-2]) + 1 for s in packs)
    assert covered + len(subjects) - len(packs) == 3000
    # And `jobs` counts every chunk's result, and `job ID` reads each one's outcome
    assert await count_results(conn, broker, "default", result.job_id) == 3000
    info = await inspect(conn, broker, "default", result.job_id)
    assert (info.n_ok, info.n_failed) == (3000, 0)
    # And a second run (a resume) folds each stored result exactly once, from the stream
    again = await fabric.run(job, every_chunk_once(), slices=4)
    assert again.resumed == 3000
    assert again.value == Counter(range(3000))


async def test_a_failing_chunk_fails_alone_inside_its_pack(code_fabric: CodeFabric) -> None:
    # Given packs of 50 chunks, where each chunk whose input ends in 7 raises
    fabric = await code_fabric(chunks_per_message=50)
    job = Job(fails_on_sevens, list(range(500)), retry=RetryPolicy(max_retries=0))
    # When it runs
    result = await fabric.run(job, every_chunk_once(), slices=2)
    # Then exactly the sevens failed, each with its own error, and every other chunk is in once
    assert sorted(f.index for f in result.failures) == list(range(7, 500, 10))
    assert all(f.error_kind is ErrorKind.ERROR for f in result.failures)
    assert "no sevens: 17" in next(f.error or "" for f in result.failures if f.index == 17)
    assert result.value == Counter(i for i in range(500) if i % 10 != 7)


async def test_retry_failed_runs_a_failed_packed_chunk_again(
    code_fabric: CodeFabric, tmp_path: Path
) -> None:
    # Given a packed job whose chunks ending in 3 fail on its first run
    fabric = await code_fabric(chunks_per_message=40)
    flag = tmp_path / "ready"
    job = Job(fails_until_flag, [(i, str(flag)) for i in range(400)], retry=RetryPolicy(0))
    first = await fabric.run(job, every_chunk_once(), slices=2)
    assert first.n_failed == 40
    # When the cause is gone and the job runs again with retry_failed
    flag.touch()
    second = await fabric.run(job, every_chunk_once(), slices=2, retry_failed=True)
    # Then every chunk succeeded and each was folded exactly once (its pack's other chunks ran
    # again, but their results are not folded twice) ...
    assert (second.n_ok, second.n_failed) == (400, 0)
    assert second.value == Counter(range(400))
    # ... and a later run finds every result stored: nothing to run
    third = await fabric.run(job, every_chunk_once(), slices=2)
    assert (third.resumed, third.n_failed) == (400, 0)
    assert third.value == Counter(range(400))


async def test_a_hanging_chunk_times_out_alone_and_its_pack_finishes(
    code_fabric: CodeFabric,
) -> None:
    # Given a pack of 10 chunks where chunk 5 hangs past its 2 s deadline
    fabric = await code_fabric(chunks_per_message=10, ack_wait_s=30.0)
    job = Job(hangs_on_five, list(range(10)), timeout_s=2.0, retry=RetryPolicy(max_retries=0))
    # When it runs
    result = await fabric.run(job, every_chunk_once(), slices=1, timeout_s=60)
    # Then only chunk 5 failed, as a timeout; its neighbours ran again alone and are in once
    assert [(f.index, f.error_kind) for f in result.failures] == [(5, ErrorKind.TIMEOUT)]
    assert result.value == Counter(i for i in range(10) if i != 5)


async def test_forged_pack_results_fail_only_their_chunks_and_the_job_runs_on(
    code_fabric: CodeFabric,
    conn: Connection,
    broker: BrokerSettings,
) -> None:
    # Given a job packed 10 chunks to a message, whose first two pack subjects already hold
    # forged results (garbage; a pack claiming fewer chunks than its subject), and a pack
    # subject past any pack's length
    fabric = await code_fabric(chunks_per_message=10)
    job = Job(square_loss, list(range(100)), retry=RetryPolicy(max_retries=0))
    job_id = job.spec(fabric.settings).job_id
    s = broker.subjects
    short = PackResult(job=job_id, first=10, outputs=(b"x",) * 5)
    for subject, data in [
        (s.result("default", job_id, 0, 9), b"\xc1garbage"),
        (s.result("default", job_id, 10, 19), encode(short)),
        (s.result("default", job_id, 0, 5000), b"\xc1garbage"),
    ]:
        await conn.js.publish(subject, data)
    # When it runs
    result = await fabric.run(job, every_chunk_once(), slices=2, timeout_s=60)
    # Then the 20 chunks whose subjects were taken failed, naming why; every other chunk is in
    assert sorted(f.index for f in result.failures) == list(range(20))
    assert {f.error_kind for f in result.failures} == {ErrorKind.INVALID_MESSAGE}
    assert result.value == Counter(range(20, 100))
    assert fabric.metrics.value("invalid_messages_total", subject="result") == 3


async def test_a_garbage_pack_on_the_work_subject_fails_its_chunks(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
) -> None:
    # Given garbage published under the id of the job's first pack (so the real pack is
    # taken for a duplicate of it)
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory(chunks_per_message=10)
    job = Job(square_loss, list(range(30)), retry=RetryPolicy(max_retries=0))
    job_id = job.spec(fabric.settings).job_id
    await conn.js.publish(
        broker.subjects.work("default", job_id),
        b"\xc1garbage",
        headers={HEADER_MSG_ID: broker.subjects.chunk_msg_id(job_id, 0, 9)},
    )
    # When the job runs
    result = await fabric.run(job, every_chunk_once(), slices=2, timeout_s=60)
    # Then the pack's ten chunks failed as invalid, the rest ran, and the node counted it
    assert sorted(f.index for f in result.failures) == list(range(10))
    assert all("not msgpack" in (f.error or "") for f in result.failures)
    assert result.value == Counter(range(10, 30))
    assert agent.metrics.value("invalid_messages_total", subject="work") == 1


async def test_a_pack_out_of_deliveries_is_recorded_exhausted_chunk_by_chunk(
    fabric_factory: FabricFactory, worker_process: WorkerProcess, tmp_path: Path
) -> None:
    # Given a pack of 5 chunks, no retries, whose only worker freezes (SIGSTOP) inside it
    proc = worker_process("frozen")
    fabric = await fabric_factory(ack_wait_s=1.0, lease_ttl_s=30.0, chunks_per_message=5)
    job = Job(
        SLEEPY,
        [sleepy_input(i) for i in range(5)],
        args={"sleep_s": 0.5, "log_dir": str(tmp_path)},
        retry=RetryPolicy(max_retries=0),
    )
    run = asyncio.create_task(fabric.run(job, ArgMin(), slices=1, timeout_s=30))
    await eventually(lambda: executions(str(tmp_path)).get(0) == 1, timeout_s=15)
    os.kill(proc.pid, signal.SIGSTOP)
    # When its ack wait passes with no delivery left
    result = await run
    # Then each of its chunks has its own final result, exhausted, and the job ends
    assert (result.n_ok, result.n_failed) == (0, 5)
    assert sorted(f.index for f in result.failures) == list(range(5))
    assert {f.error_kind for f in result.failures} == {ErrorKind.EXHAUSTED}


def fails_at_length(x: int) -> bytes:
    """Odd inputs fail with a 5,000-character message; even ones return 2,000 bytes."""
    if x % 2:
        raise ValueError("x" * 5000 + f" in chunk {x}")
    return bytes([x % 256]) * 2000


async def test_a_pack_of_long_failures_and_outputs_still_fits_its_message(
    code_fabric: CodeFabric,
) -> None:
    # Given one pack of 1,000 chunks whose failures and outputs together are 3.5 MB, over the
    # server's 1 MiB payload
    fabric = await code_fabric(chunks_per_message=1000)
    job = Job(fails_at_length, list(range(1000)), retry=RetryPolicy(max_retries=0))
    # When it runs
    result = await fabric.run(job, every_chunk_once(), slices=1, timeout_s=60)
    # Then every chunk has its own result: each odd one failed naming its chunk (the message
    # cut, its end kept), each even one's output came back whole (through the outputs store
    # when the pack's message had no room)
    assert (result.n_ok, result.n_failed) == (500, 500)
    assert all(f.error_kind is ErrorKind.ERROR for f in result.failures)
    assert all((f.error or "").endswith(f" in chunk {f.index}") for f in result.failures)
    assert result.value == Counter(range(0, 1000, 2))
    outputs = await fabric.run(job, Gather(), slices=1, timeout_s=60)  # a resume: replayed
    assert all(outputs.value[i] == bytes([i % 256]) * 2000 for i in range(0, 1000, 2))


def checkpoints_then_doubles(x: int, ctx: Any) -> int:
    """Checkpoints its state once, then returns twice its input."""
    ctx.checkpoint({"seen": x})
    return 2 * x


async def test_a_packed_chunk_may_checkpoint_and_nothing_is_stored(
    code_fabric: CodeFabric,
    conn: Connection,
    broker: BrokerSettings,
) -> None:
    # Given a packed job of a function that checkpoints
    fabric = await code_fabric(chunks_per_message=25)
    # When it runs
    result = await fabric.run(Job(checkpoints_then_doubles, list(range(100))), Gather())
    # Then every chunk ran (its checkpoint call returned) and no checkpoint was written
    assert result.value == [2 * i for i in range(100)]
    s = broker.subjects
    bucket = s.checkpoints_bucket()
    try:
        info = await conn.js.stream_info(
            s.kv_stream(bucket), subjects_filter=s.kv_job_filter(bucket, "default", result.job_id)
        )
        stored = len(info.state.subjects or {})
    except NotFoundError:  # the bucket was never made: nothing was ever stored
        stored = 0
    assert stored == 0


def fails_first_then_slow(x: int) -> int:
    """The first 40 inputs fail at once; the others take 50 ms."""
    if x < 40:
        raise ValueError("not this one")
    import time

    time.sleep(0.05)  # stands in for a chunk's real work
    return x


async def test_chunks_that_fail_at_once_do_not_make_slow_ones_look_tiny(
    code_fabric: CodeFabric,
    conn: Connection,
    broker: BrokerSettings,
) -> None:
    # Given auto packing and a job whose first chunks all fail at once, the rest run 50 ms
    fabric = await code_fabric()
    job = Job(fails_first_then_slow, list(range(80)), retry=RetryPolicy(max_retries=0))
    # When it runs
    result = await fabric.run(job, every_chunk_once(), timeout_s=60)
    # Then the slow chunks were not packed (a pack runs its chunks one after another)
    assert (result.n_ok, result.n_failed) == (40, 40)
    subjects = await result_subjects(conn, broker, result.job_id)
    assert len(subjects) == 80 and all(s.count(".") == 4 for s in subjects)


async def test_a_job_may_turn_packing_off_on_a_fabric_that_packs(
    code_fabric: CodeFabric,
    conn: Connection,
    broker: BrokerSettings,
) -> None:
    # Given a fabric that packs 10 chunks to a message
    fabric = await code_fabric(chunks_per_message=10)
    # When a job of it says one chunk per message
    result = await fabric.run(Job(square_loss, list(range(50)), chunks_per_message=1), ArgMin())
    # Then each chunk travelled alone, and the job is the same job (its id ignores the knob)
    subjects = await result_subjects(conn, broker, result.job_id)
    assert len(subjects) == 50 and all(s.count(".") == 4 for s in subjects)
    assert result.job_id == Job(square_loss, list(range(50))).spec(fabric.settings).job_id
    with pytest.raises(ValueError, match="chunks_per_message"):
        Job(square_loss, [1], chunks_per_message=-1)


async def test_long_chunks_on_many_leases_do_not_wait_for_a_first_result(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a node of 64 slices, auto packing, and a job of 64 chunks that each run 2 s
    await agent_factory("n1", simulate="1x64GiB")
    fabric = await fabric_factory()
    inputs = [sleepy_input(i) for i in range(64)]
    job = Job(SLEEPY, inputs, args={"sleep_s": 2.0, "log_dir": str(tmp_path)})
    # When it runs
    result = await fabric.run(job, Gather(), timeout_s=60)
    # Then every chunk started while the first ones ran: past the first 32 sent alone, the
    # others did not wait 2 s for a result to say whether chunks are tiny
    assert result.n_ok == 64 and result.leases_peak == 64
    starts = [entry.stat().st_mtime for entry in tmp_path.iterdir()]
    assert len(starts) == 64
    assert max(starts) - min(starts) < 1.5


async def test_tiny_chunks_hold_no_more_leases_than_their_packs_can_use(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given two nodes of 64 slices each that run code, and a job of 2000 tiny chunks
    agents = [
        await agent_factory(node, simulate="1x64GiB", allow_code=True) for node in ("n1", "n2")
    ]
    fabric = await fabric_factory()
    inputs = list(range(2000))
    # (after a first job, once its lanes are all up: a packed job asks for the rest of the
    # fleet when no first result comes within 0.1 s, as on a fresh node starting processes,
    # and a first job's chunks run in the lanes up first while the others go on starting,
    # each taking a core for a while: 14 of them on 2 cores made a first result 0.42 s late)
    await fabric.run(Job(square_loss, list(range(64)), chunks_per_message=1), ArgMin())
    await eventually(
        lambda: all(
            len(a.executors) >= a.executors.layout.lanes and not a.executors.starting
            for a in agents
        ),
        timeout_s=60,
    )
    # When it runs packed (auto, the default), and again one chunk per message
    packed = await fabric.run(Job(square_loss, inputs), ArgMin())
    alone_job = Job(square_loss, inputs, chunks_per_message=1, job_id="one-per-message")
    alone = await fabric.run(alone_job, ArgMin())
    # Then both find the argmin ...
    assert packed.value[0] == alone.value[0] == 1234
    assert packed.n_ok == alone.n_ok == 2000
    # ... but the packed job left most of the fleet to others: its few packs would have
    # idled the rest, where single chunks spread over every slice
    assert alone.leases_peak == 128
    assert packed.leases_peak <= 32 < 64
