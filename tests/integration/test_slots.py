"""Leases as execution slots.

Parallel chunks, deadlines, crashes, drain, and VRAM held by a running slot. The work here
is Python functions defined in this file, so they also prove that functions travel by value
to executor processes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory, WorkerProcess
from tests.kernels_for_tests import SLEEPY, executions, sleepy_input
from vramfabric.broker import (
    BrokerSettings,
    ChunkResult,
    Connection,
    ErrorKind,
    LeaseGrant,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
    RetryPolicy,
    decode,
    encode,
)
from vramfabric.coordinator import Fabric, Job
from vramfabric.coordinator.aggregate import Gather

FAST_RETRY = RetryPolicy(max_retries=3, initial_backoff_s=0.1, max_backoff_s=0.5)


def timed_sleep(seconds: float) -> tuple[float, float, int]:
    """Sleep; return (start, end, pid) as the executor saw them."""
    start = time.time()
    time.sleep(seconds)  # stands in for a kernel that runs this long
    return start, time.time(), os.getpid()


def hang_once(spec: dict[str, Any]) -> tuple[int, float, int]:
    """Hang (forever) the first time `spec['hang']` is set for this directory, else return."""
    marker = Path(spec["dir"]) / f"hung-{spec['i']}"
    if spec.get("hang") and not marker.exists():
        marker.write_text(str(os.getpid()))
        while True:
            time.sleep(1)  # a kernel that never ends
    time.sleep(spec.get("sleep_s", 0.0))  # stands in for a short kernel
    return spec["i"], time.time(), os.getpid()


def crash_on(spec: dict[str, Any]) -> int:
    """Segfault for real when asked, else return the value."""
    if spec.get("segfault"):
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    time.sleep(spec.get("sleep_s", 0.0))  # stands in for a short kernel
    return os.getpid()


async def running_until(run: asyncio.Task[Any], predicate: Any, timeout_s: float = 20.0) -> None:
    """Poll `predicate` while the job runs; a job that ended early raises its own error."""
    await eventually(lambda: run.done() or predicate(), timeout_s=timeout_s)
    if run.done():
        run.result()  # raises what ended the job, if anything did
        raise AssertionError("the job ended before the condition was met")


async def stored_results(
    conn: Connection, broker: BrokerSettings, job_id: str, n: int
) -> list[ChunkResult]:
    """The results the results stream holds for chunks 0..n-1 of a job."""
    stream = broker.subjects.results_stream("default")
    out = []
    for i in range(n):
        msg = await conn.js.get_last_msg(stream, broker.subjects.result("default", job_id, i))
        assert msg.data is not None
        out.append(decode(ChunkResult, msg.data))
    return out


async def test_eight_leases_run_eight_chunks_at_once(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given one node with 8 slices, and a fabric that leases all 8 (a function's leases each
    # get a process, a lane: they start a few at a time, and meanwhile chunks run in the
    # lanes already up, so the first jobs need not run all at once)
    await agent_factory("n1", simulate="1x8GiB", allow_code=True)
    fabric = await fabric_factory()
    deadline, attempt = time.monotonic() + 30, 0
    while True:
        # When 8 chunks of 0.25 s run (inputs differ per try: each is a job of its own)
        attempt += 1
        sleeps = [0.25 + 1e-6 * attempt] * 8
        result = await fabric.run(Job(timed_sleep, sleeps), Gather(), slices=8, timeout_s=30)
        starts = [start for start, _end, _pid in result.value]
        ends = [end for _start, end, _pid in result.value]
        if max(starts) < min(ends) or time.monotonic() > deadline:
            break
    # Then once the lanes are up they run at once: all started before any ended, within 0.6 s
    assert result.n_ok == 8 and result.leases_peak == 8
    assert max(starts) < min(ends)
    assert max(ends) - min(starts) < 0.6


def process_started_at(pid: int) -> float:
    """When process `pid` was created (epoch seconds, to the kernel's clock tick).

    /proc's start time counts ticks of CLOCK_BOOTTIME; it is mapped to the epoch through that
    clock read now, not through /proc/stat's `btime`, which is whole seconds and drifts from the
    wall clock on a VM (a fresh machine read process starts seconds before they were made).
    """
    with open(f"/proc/{pid}/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    boot_epoch_s = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot_epoch_s + ticks / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_executors_start_a_few_at_a_time_and_the_first_runs_its_chunk_meanwhile(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a fresh node (an agent of this process) whose function leases each need a
    # process (a lane), started one at a time (on a small machine, many importing at once
    # are all ready only at the end)
    since = time.time() - 1
    await agent_factory("n1", simulate="1x4GiB", allow_code=True, executor_starts=1)
    fabric = await fabric_factory()
    # When 4 chunks of 0.5 s run on its 4 leases
    result = await fabric.run(Job(timed_sleep, [0.5] * 4), Gather(), slices=4, timeout_s=60)
    # Then the first chunk ran before the last of the node's processes was even created
    assert result.n_ok == 4
    starts, _ends, _pids = zip(*result.value, strict=True)
    # (at least two processes: on a loaded machine the chunks may all have run in the lanes
    # already up, a chunk taking an idle lane of its tenant, before the last lane is made)
    created = [t for t in map(process_started_at, executor_children()) if t >= since]
    assert len(created) >= 2
    assert min(starts) < max(created)


def executor_children() -> list[int]:
    """The executor processes this process started (an in-process agent's)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError):
            continue  # not a process, or one that ended meanwhile
        if ppid == os.getpid() and b"vramfabric.worker.executor" in cmdline:
            pids.append(int(entry))
    return pids


async def test_process_isolation_runs_each_lease_in_a_process_of_its_own(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node that gives each lease its own executor process, after a first job (whose
    # leases each had to wait for a process to start; the next job's leases take them over)
    await agent_factory("n1", simulate="1x4GiB", allow_code=True, isolation="process")
    fabric = await fabric_factory()
    first = await fabric.run(Job(timed_sleep, [0.01] * 4), Gather(), slices=4, timeout_s=30)
    # When 4 chunks of 0.25 s run on 4 leases
    result = await fabric.run(Job(timed_sleep, [0.25] * 4), Gather(), slices=4, timeout_s=30)
    # Then each job ran in 4 different processes, and the second one's chunks ran at once
    assert first.n_ok == result.n_ok == 4
    assert len({pid for _s, _e, pid in first.value}) == 4
    starts, ends, pids = zip(*result.value, strict=True)
    assert len(set(pids)) == 4
    assert max(starts) < min(ends)


async def test_node_that_joins_mid_job_takes_a_share(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
) -> None:
    # Given a job of 24 chunks of 0.2 s running on a node of 2 slices
    await agent_factory("early", simulate="1x2GiB", allow_code=True)
    fabric = await fabric_factory()
    job = Job(timed_sleep, [0.2] * 24)
    run = asyncio.create_task(fabric.run(job, Gather(), slices=8, timeout_s=60))
    await eventually(lambda: len(fabric.fleet.adverts) == 1 and _leased(fabric) > 0)
    # When a second node with 2 slices joins mid-job
    await agent_factory("late", simulate="1x2GiB", allow_code=True)
    result = await run
    # Then the late node ran some of the remaining chunks
    assert result.n_ok == 24
    nodes = [
        r.node for r in await stored_results(conn, broker, job.spec(fabric.settings).job_id, 24)
    ]
    assert nodes.count("late") >= 2, nodes


def _leased(fabric: Fabric) -> int:
    return sum(g.leased_bytes for a in fabric.fleet.adverts.values() for g in a.gpus)


async def test_hung_chunk_is_killed_at_its_deadline_and_retried_while_neighbours_finish(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
    tmp_path: Path,
) -> None:
    # Given a node of 8 slices and a job with a 4 s deadline whose chunk 0 hangs once
    # (after a first job has started the leases' processes: their start is not measured)
    await agent_factory("n1", simulate="2x4GiB", allow_code=True)
    fabric = await fabric_factory(ack_wait_s=8.0)
    await fabric.run(Job(timed_sleep, [0.01] * 8), Gather(), slices=8, timeout_s=30)
    specs = [{"dir": str(tmp_path), "i": i, "hang": i == 0, "sleep_s": 0.05} for i in range(8)]
    # 4 s: neighbours of 0.05 s sharing the hung chunk's executor must be done before it is
    # killed at the deadline, also when a busy machine starts them late (1.5 s was too short
    # beside two busy processes: one neighbour was killed with it and ran again)
    deadline_s = 4.0
    job = Job(hang_once, specs, timeout_s=deadline_s, retry=FAST_RETRY)
    # When it runs
    result = await fabric.run(job, Gather(), slices=8, timeout_s=40)
    # Then every chunk succeeded; the neighbours finished while the hung one hung
    assert result.n_ok == 8, result.failures
    hung_at = (tmp_path / "hung-0").stat().st_mtime
    finished_at = {i: at for i, at, _pid in result.value}
    assert all(finished_at[i] < hung_at + deadline_s for i in range(1, 8)), (hung_at, finished_at)
    # And the hung chunk failed once as a timeout and succeeded in a new executor process
    hung = (await stored_results(conn, broker, job.spec(fabric.settings).job_id, 8))[0]
    assert hung.ok and hung.attempt == 2
    first_pid = int((tmp_path / "hung-0").read_text())
    assert result.value[0][2] != first_pid
    with pytest.raises(ProcessLookupError):
        os.kill(first_pid, 0)


async def test_segfault_fails_its_chunk_clearly_and_neighbours_succeed(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node of 8 slices on 2 GPUs and a job whose chunk 3 segfaults every time
    await agent_factory("n1", simulate="2x4GiB", allow_code=True)
    fabric = await fabric_factory()
    specs = [{"segfault": i == 3, "sleep_s": 0.2} for i in range(8)]
    retry = RetryPolicy(max_retries=2, initial_backoff_s=0.1, max_backoff_s=0.2)
    # When it runs
    result = await fabric.run(Job(crash_on, specs, retry=retry), Gather(), slices=8, timeout_s=40)
    # Then only that chunk failed, as a crash that names the signal; every neighbour succeeded
    assert result.n_ok == 7 and result.n_failed == 1
    failure = result.failures[0]
    assert failure.index == 3 and failure.error_kind is ErrorKind.CRASHED
    assert "SIGSEGV" in (failure.error or "")
    # And the node's executors were respawned: the next job runs, in a live process
    again = await fabric.run(Job(crash_on, [{}, {}]), Gather(), slices=2, timeout_s=20)
    assert again.n_ok == 2
    for pid in again.value:
        os.kill(pid, 0)


async def test_released_lease_stops_its_chunk_before_its_slice_is_granted_again(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    tmp_path: Path,
) -> None:
    # Given a node of 2 slices, both leased to a job, one running a 2 s chunk
    from tests.integration.test_chunks import prepare_job

    await agent_factory("n1", simulate="1x2GiB")
    job = Job(SLEEPY, [sleepy_input(9)], args={"sleep_s": 2.0, "log_dir": str(tmp_path)})
    job_id = await prepare_job(conn, broker, job, "n1", leases=2)
    grant_subject = broker.subjects.lease("default", "n1", "acquire")
    await conn.js.publish(broker.subjects.work("default", job_id), _chunk(job_id, 9))
    await eventually(lambda: executions(str(tmp_path)).get(9) == 1)
    # When the job releases both leases while the chunk runs
    reply = await conn.nc.request(
        broker.subjects.lease("default", "n1", "release"),
        encode(ReleaseRequest(lease_ids=("p1-0", "p1-1"))),
        timeout=2,
    )
    assert sorted(decode(ReleaseReply, reply.data).released) == ["p1-0", "p1-1"]

    async def ask(request_id: str) -> int:
        req = LeaseRequest(request_id=request_id, job="other", count=2, slice_bytes=2**30, ttl_s=30)
        r = await conn.nc.request(grant_subject, encode(req), timeout=2)
        return len(decode(LeaseGrant, r.data).leases)

    # Then the chunk is stopped with its lease, not run to its end (no slice is leased again
    # while an ended lease's code runs on it: test_ended_lease_work.py checks the order), and
    # both slices are granted again well before the 2 s chunk would have ended
    granted = await ask("q1")
    if granted < 2:
        await eventually(lambda: ask_once(ask, "q2"), timeout_s=5)
    assert executions(str(tmp_path)) == {9: 1}
    assert not await _has_result(conn, broker, job_id, 9)


async def ask_once(ask: Any, request_id: str) -> bool:
    """One grant from a fresh request id (a retried id would get its first answer back)."""
    return bool(await ask(f"{request_id}{time.monotonic_ns()}"))


def _chunk(job_id: str, value: int) -> bytes:
    from vramfabric.broker import Chunk

    return encode(Chunk(job=job_id, index=0, input=sleepy_input(value)))


async def _has_result(conn: Connection, broker: BrokerSettings, job_id: str, _value: int) -> bool:
    stream = broker.subjects.results_stream("default")
    info = await conn.js.stream_info(
        stream, subjects_filter=broker.subjects.result_filter("default", job_id)
    )
    return bool(info.state.subjects)


@pytest.mark.timeout(90)
async def test_sigterm_with_a_hung_chunk_exits_0_in_time_and_the_chunk_finishes_elsewhere(
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
    worker_process: WorkerProcess,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # Given a worker process (2 s drain grace) running a chunk that hangs on its first run
    monkeypatch.setenv("VRAMFABRIC_DRAIN_GRACE_S", "2")
    proc = worker_process("doomed", "--allow-code")
    fabric = await fabric_factory(ack_wait_s=2.0, lease_ttl_s=3.0)
    spec = {"dir": str(tmp_path), "i": 0, "hang": True}
    run = asyncio.create_task(
        fabric.run(Job(hang_once, [spec], retry=FAST_RETRY), Gather(), slices=1, timeout_s=60)
    )
    await running_until(run, lambda: (tmp_path / "hung-0").exists())
    await agent_factory("survivor", simulate="1x4GiB", allow_code=True)
    # When the worker is told to stop
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 10)
    # Then it exits 0 within 5 s, and the chunk is completed by the other node
    assert code == 0 and time.monotonic() - t0 < 5.0
    result = await run
    assert result.n_ok == 1 and result.value[0][0] == 0


async def test_function_runs_only_where_code_is_allowed(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
    tmp_path: Path,
) -> None:
    # Given a node started without --allow-code
    await agent_factory("plain")
    fabric = await fabric_factory()
    job = Job(scale, [1, 2, 3])
    # When a job of a function defined in this file runs, it is refused up front
    from vramfabric.broker.errors import CodeRefused

    with pytest.raises(CodeRefused, match="--allow-code"):
        await fabric.run(job, Gather(), timeout_s=20)
    # And a coordinator that asked that node anyway gets a clear permanent failure
    from tests.integration.test_chunks import prepare_job
    from vramfabric.coordinator.jobs.work import upload

    await upload(fabric._runner.kernels, job.work)
    job_id = await prepare_job(conn, broker, job, "plain", leases=1)
    from vramfabric.broker import Chunk

    await conn.js.publish(
        broker.subjects.work("default", job_id),
        encode(Chunk(job=job_id, index=0, input=job.encoded[0])),
    )
    await eventually(lambda: _has_result(conn, broker, job_id, 0))
    (refused,) = await stored_results(conn, broker, job_id, 1)
    assert refused.error_kind is ErrorKind.CODE_REFUSED and "--allow-code" in (refused.error or "")
    # When a worker process with --allow-code joins, from a directory where this file is
    # not importable, the function runs there
    proc = _worker_elsewhere(broker, tmp_path, "coder", "--allow-code")
    try:
        await eventually(lambda: "coder" in fabric.fleet.adverts, timeout_s=20)
        result = await fabric.run(Job(scale, [1, 2, 3], job_id="elsewhere"), Gather(), timeout_s=30)
        assert result.value == [10, 20, 30]
    finally:
        proc.terminate()
        proc.wait(10)


FACTOR = 10


def scale(x: int) -> int:
    """Multiply by a module-level constant (which must travel with the function)."""
    return x * FACTOR


def _worker_elsewhere(
    broker: BrokerSettings, cwd: Path, node: str, *args: str
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        VRAMFABRIC_NATS_URL=broker.url,
        VRAMFABRIC_PREFIX=broker.prefix,
        VRAMFABRIC_NODE_TTL_S=str(broker.node_ttl_s),
    )
    from vramfabric.broker.server import die_with_parent

    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vramfabric.worker",
            "--simulate",
            "1x4GiB",
            "--slice",
            "1GiB",
            "--node",
            node,
            *args,
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )


def steps_with_checkpoints(spec: dict[str, Any], ctx: Any) -> int:
    """Ten steps of 0.1 s, checkpointing each; logs every step it really runs."""
    log = Path(spec["dir"]) / "steps.log"
    (Path(spec["dir"]) / "pid").write_text(str(os.getpid()))
    first = 0 if ctx.resumed is None else ctx.resumed + 1
    for step in range(first, 10):
        time.sleep(0.1)  # one step of a long computation
        with log.open("a") as f:
            f.write(f"{step} {ctx.attempt}\n")
        ctx.checkpoint(step)
    return first


async def test_checkpointing_function_killed_mid_chunk_resumes_from_its_checkpoint(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
    tmp_path: Path,
) -> None:
    # Given a long chunk that checkpoints after each of its 10 steps
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory(ack_wait_s=3.0)
    job = Job(steps_with_checkpoints, [{"dir": str(tmp_path)}], retry=FAST_RETRY)
    run = asyncio.create_task(fabric.run(job, Gather(), slices=1, timeout_s=40))
    log = tmp_path / "steps.log"
    await running_until(run, lambda: log.exists() and len(log.read_text().split("\n")) > 4)
    # When its executor process is killed mid-chunk
    os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
    result = await run
    # Then the redelivered chunk resumed after its last checkpoint: no step ran twice
    assert result.n_ok == 1 and result.value[0] > 0
    steps = [int(line.split()[0]) for line in log.read_text().splitlines()]
    assert steps == list(range(10))
    attempts = {line.split()[1] for line in log.read_text().splitlines()}
    assert attempts == {"1", "2"}
    # And the checkpoint was deleted with the result
    kv = await conn.js.key_value(broker.subjects.checkpoints_bucket())
    from nats.js.errors import KeyNotFoundError

    with pytest.raises(KeyNotFoundError):
        await kv.get(broker.subjects.checkpoint_key("default", job.spec(fabric.settings).job_id, 0))


def big_output(n: int) -> bytes:
    """The digit n, n * 100,000 times, as bytes."""
    return str(n).encode() * (n * 100_000)


async def test_large_outputs_go_through_the_object_store_and_over_limit_ones_fail_at_once(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
) -> None:
    # Given a node and a function whose outputs reach 900 kB (the inline limit is 256 KiB)
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    job = Job(big_output, [1, 2, 9])
    # When it runs
    result = await fabric.run(job, Gather(), timeout_s=30)
    # Then the outputs aggregate whole, and the large ones were stored as objects
    assert result.value == [b"1" * 100_000, b"2" * 200_000, b"9" * 900_000]
    stored = await stored_results(conn, broker, job.spec(fabric.settings).job_id, 3)
    assert stored[0].output_ref is None and stored[2].output_ref is not None
    # And an output past the function's declared limit fails permanently, naming the sizes
    capped = Job(big_output, [3], max_output_bytes=100_000, retry=FAST_RETRY)
    failed = await fabric.run(capped, Gather(), timeout_s=30)
    (failure,) = failed.failures
    assert failure.error_kind is ErrorKind.LAUNCH_FAILED and failure.attempt == 1
    assert "exceeds max_output_bytes=100000" in (failure.error or "")


def flaky(spec: dict[str, Any]) -> int:
    """Fail until the flag file exists."""
    if spec["bad"] and not Path(spec["flag"]).exists():
        raise ValueError("the flag is not there yet")
    i: int = spec["i"]
    return i


async def test_rerun_with_retry_failed_turns_a_failed_chunk_into_a_success(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a job whose chunk 2 failed for a reason that has since gone away
    await agent_factory("n1", allow_code=True)
    fabric = await fabric_factory()
    flag = tmp_path / "flag"
    specs = [{"i": i, "bad": i == 2, "flag": str(flag)} for i in range(4)]
    first = await fabric.run(Job(flaky, specs), Gather(), timeout_s=30)
    assert first.n_failed == 1 and "flag is not there" in (first.failures[0].error or "")
    flag.touch()
    # When it is rerun plainly, the failure stands (a rerun resumes)
    again = await fabric.run(Job(flaky, specs), Gather(), timeout_s=30)
    assert again.n_failed == 1 and again.resumed == 4
    # When it is rerun with retry_failed, the chunk runs again and succeeds
    retried = await fabric.run(Job(flaky, specs), Gather(), timeout_s=30, retry_failed=True)
    assert retried.n_failed == 0 and retried.value == [0, 1, 2, 3]
