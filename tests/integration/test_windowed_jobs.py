"""Jobs over generators: lazy, windowed submission, and a results follower that never hangs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from nats.aio.msg import Msg

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from tests.kernels_for_tests import SLEEPY, sleepy_input
from vramfabric.broker import BrokerSettings, Connection, topology
from vramfabric.coordinator import Fabric, Job, Mean
from vramfabric.coordinator.jobs.joblist import read_spec
from vramfabric.coordinator.run.follow import Follower, FollowerStalled
from vramfabric.coordinator.run.results import ResultsConsumer


async def test_job_from_a_generator_runs_and_stores_its_real_chunk_count(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a job whose inputs come from a generator, with an id to resume it by
    await agent_factory("n1")
    fabric = await fabric_factory()
    job = Job(SLEEPY, (sleepy_input(i) for i in range(50)), job_id="gen50")
    # When it runs
    result = await fabric.run(job, Mean(), slices=4, timeout_s=60)
    # Then every chunk ran once and the mean is over all of them
    assert (result.n_chunks, result.n_ok, result.value) == (50, 50, sum(range(50)) / 50)
    # And the stored spec names the real count, as a sized job's would
    spec = await read_spec(fabric.conn, fabric.broker, "default", "gen50")
    assert spec.n_chunks == 50 and spec.inputs_digest


async def test_generator_job_without_an_id_gets_a_fresh_one_each_run(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given two jobs over equal generators and no job id
    await agent_factory("n1")
    fabric = await fabric_factory()
    first = await fabric.run(Job(SLEEPY, (sleepy_input(i) for i in range(3))), Mean())
    second = await fabric.run(Job(SLEEPY, (sleepy_input(i) for i in range(3))), Mean())
    # Then each ran as a job of its own (a generator cannot be read again to name it)
    assert first.job_id != second.job_id
    assert first.n_ok == second.n_ok == 3 and second.resumed == 0


async def test_work_stream_never_holds_more_than_the_window_and_results_fold_early(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a coordinator that keeps at most 5 chunks in flight
    await agent_factory("n1")
    fabric = await fabric_factory(submit_window=5)
    folded: list[int] = []
    at_last_input: list[int] = []

    def inputs() -> Iterator[bytes]:
        for i in range(60):
            if i == 59:
                at_last_input.append(len(folded))
            yield sleepy_input(i)

    # When a 60-chunk job runs while the work stream is watched
    peak = 0
    stop = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        stream = fabric.broker.subjects.work_stream("default")
        while not stop.is_set():
            info = await fabric.conn.js.stream_info(stream)
            peak = max(peak, info.state.messages)
            await asyncio.sleep(0.005)  # sampling interval of the watch, not synchronisation

    watcher = asyncio.get_running_loop().create_task(watch())
    job = Job(SLEEPY, inputs(), args={"sleep_s": 0.01})

    def progress(results: ResultsConsumer) -> None:
        folded.append(results.n_done)

    try:
        result = await fabric.run(job, Mean(), slices=4, progress=progress, timeout_s=60)
    finally:
        stop.set()
        await watcher
    # Then the job is whole, and the stream never held more than the window (plus, per
    # lease, a chunk whose result is in but whose ack, sent just after it, is not yet)
    assert result.n_ok == 60 and result.value == sum(range(60)) / 60
    assert 0 < peak <= 5 + 4
    # And all but a window's worth were folded before the generator's last input was read
    assert at_last_input[0] >= 60 - 5 - 1


async def _pause_results_consumers(fabric: Fabric, stop: asyncio.Event, paused: set[str]) -> int:
    """Pause every consumer of the tenant's results stream for an hour (named in `paused`)."""
    stream = fabric.broker.subjects.results_stream("default")
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    while not stop.is_set():
        for info in await fabric.conn.js.consumers_info(stream):
            if info.name not in paused:
                with contextlib.suppress(Exception):  # gone meanwhile: the next one is paused
                    await fabric.conn.js.pause_consumer(stream, info.name, until)
                    paused.add(info.name)
        await asyncio.sleep(0.05)  # polling interval: consumers appear when the run makes them
    return len(paused)


async def test_stalled_results_consumer_is_resubscribed_and_the_job_completes(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a running job whose results consumer the server stops delivering from
    await agent_factory("n1")
    fabric = await fabric_factory(follow_stall_s=1.0)
    job = Job(SLEEPY, [sleepy_input(i) for i in range(30)], args={"sleep_s": 0.02})
    run = asyncio.get_running_loop().create_task(fabric.run(job, Mean(), timeout_s=30))
    stop = asyncio.Event()
    paused: set[str] = set()
    pauser = asyncio.get_running_loop().create_task(_pause_results_consumers(fabric, stop, paused))
    await eventually(lambda: bool(paused))
    stop.set()  # only the first consumer stays paused
    assert await pauser >= 1
    # When the follower notices it gets nothing while results wait for it
    result = await run
    # Then it resubscribed and the job completed with every result
    assert result.n_ok == 30 and result.value == sum(range(30)) / 30


async def test_follower_whose_handler_never_returns_gives_up_with_a_clear_error(
    conn: Connection, broker: BrokerSettings
) -> None:
    # Given results stored for a job, and a follower whose handler hangs on the first one
    # (as one awaiting an output that never comes would)
    await topology.ensure_tenant(conn.js, broker, "default")
    s = broker.subjects
    for i in range(3):
        await conn.js.publish(s.result("default", "hung", i), b"x")
    failures: list[FollowerStalled] = []

    async def hang(_msg: Msg) -> None:
        await asyncio.Event().wait()

    follower = Follower(
        conn,
        s.result_filter("default", "hung"),
        s.results_stream("default"),
        hang,
        broker.call_retry,
        stall_s=0.5,
        handle_limit_s=1.0,
        on_fail=failures.append,
    )
    await follower.start()
    try:
        # When resubscribing (which cancels the handler and delivers again) does not help
        await eventually(lambda: bool(failures), timeout_s=15)
    finally:
        await follower.stop()
    # Then it gives up once, saying why, rather than hang for ever
    assert len(failures) == 1 and follower.handled == 0
    assert "stopped arriving" in str(failures[0]) and "3 resubscribes" in str(failures[0])
