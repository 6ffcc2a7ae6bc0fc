"""Chunks through JetStream: idempotent submission, first result wins, hostile work messages."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import msgpack

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory, WorkerProcess
from tests.kernels_for_tests import SLEEPY, executions, sleepy_input
from vramfabric.broker import (
    BrokerSettings,
    Chunk,
    ChunkResult,
    Connection,
    ErrorKind,
    LeaseGrant,
    LeaseRequest,
    RetryPolicy,
    buckets,
    decode,
    encode,
    topology,
)
from vramfabric.broker.subjects import HEADER_MSG_ID
from vramfabric.coordinator import ArgMin, CoordinatorSettings, Job


async def prepare_job(
    conn: Connection, broker: BrokerSettings, job: Job, node: str, leases: int
) -> str:
    """Store the job's spec and consumer and lease slices on `node`, as a coordinator would."""
    spec = job.spec(CoordinatorSettings(ack_wait_s=2.0))
    await topology.ensure_tenant(conn.js, broker, spec.tenant)
    kv = await buckets.jobs_bucket(conn.js, broker)
    await kv.put(broker.subjects.job_key(spec.tenant, spec.job_id), encode(spec))
    await topology.ensure_job_consumer(conn.js, broker, spec)
    req = LeaseRequest(request_id="p1", job=spec.job_id, count=leases, slice_bytes=2**30, ttl_s=30)
    reply = await conn.nc.request(
        broker.subjects.lease(spec.tenant, node, "acquire"), encode(req), timeout=2
    )
    assert len(decode(LeaseGrant, reply.data).leases) == leases
    return spec.job_id


async def results_of(conn: Connection, broker: BrokerSettings, job_id: str) -> dict[str, int]:
    """Messages per result subject of the job in the results stream."""
    info = await conn.js.stream_info(
        broker.subjects.results_stream("default"),
        subjects_filter=broker.subjects.result_filter("default", job_id),
    )
    return dict(info.state.subjects or {})


async def test_chunk_published_twice_yields_one_result(
    conn: Connection, broker: BrokerSettings, agent_factory: AgentFactory, tmp_path: Path
) -> None:
    # Given a node holding leases for a job of 1 chunk that logs its executions
    agent = await agent_factory("n1")
    job = Job(SLEEPY, [sleepy_input(7)], args={"log_dir": str(tmp_path)})
    job_id = await prepare_job(conn, broker, job, "n1", leases=2)
    subject = broker.subjects.work("default", job_id)
    data = encode(Chunk(job=job_id, index=0, input=sleepy_input(7)))
    # When the same chunk is published twice with its id (a retried submission) ...
    acks = [
        await conn.js.publish(subject, data, headers={HEADER_MSG_ID: f"{job_id}:0"})
        for _ in range(2)
    ]
    assert [a.duplicate for a in acks] == [None, True]
    # ... and twice more under other ids (a resubmission after the dedup window)
    for suffix in ("late-1", "late-2"):
        await conn.js.publish(subject, data, headers={HEADER_MSG_ID: f"{job_id}:{suffix}"})
    # Then the stream keeps exactly one result, and the later executions are counted duplicates
    await eventually(lambda: agent.metrics.value("gpu_results_duplicate_total") == 2, timeout_s=10)
    assert await results_of(conn, broker, job_id) == {
        broker.subjects.result("default", job_id, 0): 1
    }
    assert executions(str(tmp_path)) == {7: 3}


async def test_first_result_wins_and_a_second_is_rejected(
    conn: Connection, broker: BrokerSettings
) -> None:
    # Given a recorded result
    await topology.ensure_tenant(conn.js, broker, "default")
    subject = broker.subjects.result("default", "jx", 3)
    first = ChunkResult(job="jx", index=3, ok=True, output=b"1234", node="a")
    await conn.js.publish(subject, encode(first))
    # When another worker publishes its result for the same chunk
    from vramfabric.broker import ResultAlreadyRecorded, from_nats

    try:
        await conn.js.publish(
            subject, encode(ChunkResult(job="jx", index=3, ok=True, output=b"9999", node="b"))
        )
        raised = None
    except Exception as exc:
        raised = from_nats(exc)
    # Then it is rejected as "already recorded", and the first one stays
    assert isinstance(raised, ResultAlreadyRecorded)
    msg = await conn.js.get_last_msg(broker.subjects.results_stream("default"), subject)
    assert msg.data is not None
    assert decode(ChunkResult, msg.data).node == "a"


async def test_chunk_of_a_killed_worker_is_finished_by_another_lease(
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
    worker_process: WorkerProcess,
    tmp_path: Path,
) -> None:
    # Given worker A (a real process) running the only chunk of a job
    proc = worker_process("doomed", "--heartbeat-s", "0.2")
    fabric = await fabric_factory(ack_wait_s=1.0, lease_ttl_s=3.0)
    job = Job(
        SLEEPY,
        [sleepy_input(5)],
        args={"sleep_s": 1.5, "log_dir": str(tmp_path)},
        retry=RetryPolicy(max_retries=3, initial_backoff_s=0.2, max_backoff_s=1.0),
    )
    run = asyncio.create_task(fabric.run(job, ArgMin(), slices=1, timeout_s=40))
    await eventually(lambda: executions(str(tmp_path)).get(5) == 1, timeout_s=15)
    # When a second node joins and A is killed -9 before it acks
    survivor = await agent_factory("survivor", simulate="1x4GiB")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    result = await run
    # Then the chunk was redelivered to the survivor's lease and finished there
    assert result.n_ok == 1 and result.value == (0, 5.0)
    assert executions(str(tmp_path)) == {5: 2}
    assert survivor.metrics.value("gpu_submit_total") == 1


async def test_malformed_work_messages_are_rejected_and_the_job_still_completes(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
) -> None:
    # Given a node and a job whose chunk 0 slot is taken by a garbage message with its id
    agent = await agent_factory("n1")
    fabric = await fabric_factory()
    job = Job(SLEEPY, [sleepy_input(i) for i in range(10)])
    spec = job.spec(fabric.settings)
    subject = broker.subjects.work("default", spec.job_id)
    await conn.js.publish(subject, b"\xc1garbage", headers={HEADER_MSG_ID: f"{spec.job_id}:0"})
    # And garbage without any chunk id: wrong type, wrong version, bad msgpack, wrong job
    garbage = [
        msgpack.packb({"t": "Chunk", "v": 1, "job": spec.job_id, "index": "zero", "input": b""}),
        msgpack.packb({"t": "Chunk", "v": 7, "job": spec.job_id, "index": 1, "input": b""}),
        b"\xff\xfe",
        encode(Chunk(job="otherjob", index=1, input=b"abcd")),
    ]
    for data in garbage:
        await conn.js.publish(subject, data)
    # When the job runs
    result = await fabric.run(job, ArgMin(), timeout_s=30)
    # Then chunk 0 failed with a clear invalid_message error, every other chunk succeeded
    assert result.n_ok == 9 and result.n_failed == 1
    failure = result.failures[0]
    assert failure.index == 0 and failure.error_kind is ErrorKind.INVALID_MESSAGE
    assert "not msgpack" in (failure.error or "")
    # And each hostile message was counted, and the node serves the next job
    assert agent.metrics.value("invalid_messages_total", subject="work") == 5
    again = await fabric.run(Job(SLEEPY, [sleepy_input(3)]), ArgMin(), timeout_s=30)
    assert again.n_ok == 1


async def test_chunk_out_of_deliveries_is_recorded_as_exhausted(
    fabric_factory: FabricFactory, worker_process: WorkerProcess, tmp_path: Path
) -> None:
    # Given a job with no retries whose only worker freezes (SIGSTOP) inside the chunk
    proc = worker_process("frozen")
    fabric = await fabric_factory(ack_wait_s=1.0, lease_ttl_s=30.0)
    job = Job(
        SLEEPY,
        [sleepy_input(4)],
        args={"sleep_s": 0.5, "log_dir": str(tmp_path)},
        retry=RetryPolicy(max_retries=0),
    )
    run = asyncio.create_task(fabric.run(job, ArgMin(), slices=1, timeout_s=30))
    await eventually(lambda: executions(str(tmp_path)).get(4) == 1, timeout_s=15)
    os.kill(proc.pid, signal.SIGSTOP)
    # When its ack wait passes with no delivery left
    result = await run
    # Then the chunk's final result says it was exhausted, and the job ends
    assert result.n_failed == 1 and result.n_ok == 0
    assert result.failures[0].error_kind is ErrorKind.EXHAUSTED
    assert "1 deliveries" in (result.failures[0].error or "")
