"""Auth on: the server itself refuses a tenant everything of another tenant's, promptly."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import tomllib
import uuid
from pathlib import Path
from typing import Any

import attrs
import nats.js.errors
import nkeys
import pytest
from nats.js.api import ConsumerConfig
from nats.js.kv import KeyValue

from tests.authsetup import (
    CAROL_SEED,
    PROMPT_S,
    REQUEST_TIMEOUT_S,
    TENANTS_TOML,
    AuthFabric,
    refused,
)
from tests.helpers import eventually
from tests.kernels_for_tests import SLEEPY, executions, sleepy_input
from vramfabric import cli, exits
from vramfabric.broker import buckets, tenants
from vramfabric.broker.codec import encode
from vramfabric.broker.connection import connect
from vramfabric.broker.errors import ErrorKind, JobCancelled, JobNotFound, PermissionDenied
from vramfabric.broker.messages import ReleaseRequest, RenewRequest
from vramfabric.broker.objects import write_object
from vramfabric.coordinator import Fabric, Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.coordinator.jobs import joblist, lifecycle
from vramfabric.coordinator.leases.leasing import LeasePool
from vramfabric.local import LocalFleet
from vramfabric.worker import Agent, WorkerSettings


async def test_unauthenticated_and_wrong_password_clients_are_refused(
    auth_fabric: AuthFabric,
) -> None:
    # Given a server with auth on
    # When a client connects without credentials, or with a wrong password
    # Then the server refuses both, and the client gets PermissionDenied (not a retryable error)
    with pytest.raises(PermissionDenied):
        await connect(auth_fabric.base, name="anonymous")
    with pytest.raises(PermissionDenied):
        await connect(auth_fabric.as_user("alice", "wrong"), name="wrong")


async def test_tenant_b_cannot_read_a_results(auth_fabric: AuthFabric, connections: Any) -> None:
    # Given a result stored in alice's results stream
    s = auth_fabric.base.subjects
    a = await connections(auth_fabric.tenant("alice"))
    b = await connections(auth_fabric.tenant("bob"))
    await a.js.publish(s.result("alice", "job1", 0), b"alice's result")
    stream, subject = s.results_stream("alice"), s.result_filter("alice", "job1")
    # When bob follows it with an ordered consumer, gets it by sequence or subscribes to it
    # Then each is refused promptly
    assert await refused(b.js.subscribe(subject, stream=stream, ordered_consumer=True)) < PROMPT_S
    assert await refused(b.js.get_msg(stream, 1)) < PROMPT_S
    assert await refused(b.nc.subscribe(subject)) < PROMPT_S
    # And alice herself reads it (the refusal is about bob, not a broken grant)
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_msg(msg: Any) -> None:
        await got.put(msg.data)

    sub = await a.js.subscribe(subject, stream=stream, ordered_consumer=True, cb=on_msg)
    assert await asyncio.wait_for(got.get(), 5) == b"alice's result"
    await sub.unsubscribe()


async def test_tenant_b_cannot_publish_to_a_work(auth_fabric: AuthFabric, connections: Any) -> None:
    # Given alice's work subject
    s = auth_fabric.base.subjects
    b = await connections(auth_fabric.tenant("bob"))
    # When bob publishes a chunk to it
    # Then the server refuses it, promptly, and nothing lands in alice's stream
    assert await refused(b.js.publish(s.work("alice", "job1"), b"x")) < PROMPT_S
    op = await connections(auth_fabric.operator_of("alice"))
    info = await op.js.stream_info(s.work_stream("alice"))
    assert info.state.messages == 0


async def test_tenant_b_cannot_read_a_job_specs(auth_fabric: AuthFabric, connections: Any) -> None:
    # Given a job spec of alice's in her jobs bucket
    s = auth_fabric.base.subjects
    a = await connections(auth_fabric.tenant("alice"))
    b = await connections(auth_fabric.tenant("bob"))
    await a.js.publish(s.job_spec("alice", "job1"), b"alice's spec")
    bucket = s.jobs_bucket()
    # When bob binds the jobs bucket (his account's own) and gets her key directly, by
    # message, or through a consumer over the whole bucket
    kv = await b.js.key_value(bucket)
    for direct in (True, False):
        kv = KeyValue(
            name=bucket, stream=s.kv_stream(bucket), pre=f"$KV.{bucket}.", js=b.js, direct=direct
        )
        # Then her spec is not there for him
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await kv.get(s.job_key("alice", "job1"))
    sub = await b.js.pull_subscribe(s.kv_subjects(bucket), stream=s.kv_stream(bucket))
    assert (await sub.consumer_info()).num_pending == 0
    # And he may not even subscribe to the subjects of her keys
    assert await refused(b.nc.subscribe(s.kv_subjects(bucket))) < PROMPT_S


async def test_tenant_b_cannot_create_or_delete_consumers_on_a_streams(
    auth_fabric: AuthFabric, connections: Any
) -> None:
    # Given alice's streams and a consumer alice made on her work stream
    s = auth_fabric.base.subjects
    a = await connections(auth_fabric.tenant("alice"))
    b = await connections(auth_fabric.tenant("bob"))
    work = s.work_stream("alice")
    mine = ConsumerConfig(
        durable_name=s.job_consumer("job1"), filter_subject=s.work("alice", "job1")
    )
    await a.js.add_consumer(work, mine)
    # When bob creates a consumer on each of alice's streams (named, durable or ephemeral)
    for stream in (work, s.results_stream("alice"), s.dead_stream("alice")):
        for config in (
            ConsumerConfig(durable_name="sneaky"),
            ConsumerConfig(name="sneaky", filter_subject=s.work("alice", "job1")),
            ConsumerConfig(),
        ):
            # Then the server refuses each
            assert await refused(b.js.add_consumer(stream, config)) < PROMPT_S
    # And he cannot delete alice's consumer, nor overwrite it
    assert await refused(b.js.delete_consumer(work, s.job_consumer("job1"))) < PROMPT_S
    hijack = ConsumerConfig(name=s.job_consumer("job1"), filter_subject=s.work("alice", "job2"))
    assert await refused(b.js.add_consumer(work, hijack)) < PROMPT_S
    info = await a.js.consumer_info(work, s.job_consumer("job1"))
    assert info.config.filter_subject == s.work("alice", "job1")


async def test_tenant_b_cannot_see_a_replies_or_touch_a_leases(
    auth_fabric: AuthFabric, connections: Any
) -> None:
    # Given alice's inbox and lease subjects
    s = auth_fabric.base.subjects
    b = await connections(auth_fabric.tenant("bob"))
    # When bob subscribes to alice's inbox, or renews or releases leases as alice
    # Then the server refuses each promptly
    assert await refused(b.nc.subscribe(f"{s.inbox_prefix('alice')}.>")) < PROMPT_S
    renew = encode(RenewRequest(("lease-1",), 5.0))
    release = encode(ReleaseRequest(("lease-1",)))
    subject = s.lease("alice", "node1", "renew")
    assert await refused(b.nc.request(subject, renew, timeout=REQUEST_TIMEOUT_S)) < PROMPT_S
    subject = s.lease("alice", "node1", "release")
    assert await refused(b.nc.request(subject, release, timeout=REQUEST_TIMEOUT_S)) < PROMPT_S


async def test_worker_user_cannot_read_results(auth_fabric: AuthFabric, connections: Any) -> None:
    # Given a result in alice's results stream
    s = auth_fabric.base.subjects
    w = await connections(auth_fabric.worker)
    await w.js.publish(s.result("alice", "job9", 0), b"computed")
    stream = s.results_stream("alice")
    # When the workers' user follows or fetches it, or subscribes to result subjects
    # Then the server refuses each (a worker only ever publishes results)
    subject = s.result_filter("alice")
    assert await refused(w.js.subscribe(subject, stream=stream, ordered_consumer=True)) < PROMPT_S
    assert await refused(w.js.get_msg(stream, 1)) < PROMPT_S
    assert await refused(w.nc.subscribe(subject)) < PROMPT_S


def sleepy_job(n: int, sleep_s: float, log_dir: Path | None = None) -> Job:
    """A job of `n` sleepy chunks (values 0..n-1), logging executions to `log_dir`."""
    args: dict[str, Any] = {"sleep_s": sleep_s}
    if log_dir is not None:
        args["log_dir"] = str(log_dir)
    return Job(SLEEPY, [sleepy_input(i) for i in range(n)], args=args, job_id=uuid.uuid4().hex[:12])


async def test_a_job_runs_with_auth_on_and_code_follows_the_tenants_file(
    agents: Any, fabrics: Any
) -> None:
    # Given a node that runs code, alice (allow_code) and bob (not)
    await agents("n-code", allow_code=True)
    alice, bob = await fabrics("alice"), await fabrics("bob")
    await eventually(lambda: bool(alice.fleet.adverts) and bool(bob.fleet.adverts))
    # When alice runs a kernel job and a Python function, and bob runs the same function
    done = await alice.run(sleepy_job(8, 0.0), Gather(), timeout_s=30)
    mine = await alice.run(Job(abs, [-1, -2, 3]), Gather(), timeout_s=30)
    theirs = await bob.run(Job(abs, [-1, -2, 3], job_id="bobabs"), Gather(), timeout_s=30)
    # Then alice's jobs complete through the permissions of her user and the workers'
    assert done.ok and [x.tolist() for x in done.value] == [[float(i)] for i in range(8)]
    assert mine.ok and mine.value == [1, 2, 3], mine.failures[0].error
    # And bob's chunks fail permanently with code_refused, naming the tenants file
    assert theirs.n_failed == 3
    assert {f.error_kind for f in theirs.failures} == {ErrorKind.CODE_REFUSED}
    assert "tenants file" in (theirs.failures[0].error or "")


def held_slices(fabric: Fabric, tenant: str) -> int:
    """Slices (1 GiB) the tenant holds over the fleet, as the nodes' adverts say."""
    return sum(a.tenants.get(tenant, 0) for a in fabric.fleet.adverts.values()) // 2**30


async def test_grants_stop_at_the_quota(agents: Any, fabrics: Any) -> None:
    # Given two nodes of 16 one-GiB slices each, and alice's quota of 6 GiB: each node alone
    # could grant far more than the quota plus the documented overshoot
    quota, nodes = 6, 2
    await agents("q1", simulate="2x8GiB", waiting_ttl_s=2.0)
    await agents("q2", simulate="2x8GiB", waiting_ttl_s=2.0)
    alice = await fabrics("alice")
    await eventually(lambda: len(alice.fleet.adverts) == nodes)
    # When alice asks for all 32 slices, both nodes at once, then again
    pool = LeasePool(alice.conn, alice.broker, alice.settings, alice.fleet, "quota-job")
    first = await pool.acquire(32)
    await eventually(lambda: held_slices(alice, "alice") == first)
    again = await pool.acquire(32)
    # Then grants stop at the quota, plus at most what the other nodes granted in flight:
    # the bound docs/operations/tenants.md states, (nodes asked - 1) x (room left under the quota)
    assert quota <= first <= quota + (nodes - 1) * quota
    assert again == 0 and pool.denials >= 1
    await pool.release()


async def test_fair_share_halves_a_full_fleet_when_another_tenant_arrives(
    agents: Any, fabrics: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given two nodes of 4 slices each, and bob's long job holding all 8 (bob has no quota)
    caplog.set_level(logging.WARNING, "vramfabric.worker.chunks.puller")
    for node in ("f1", "f2"):
        await agents(node, waiting_ttl_s=2.0)
    alice = await fabrics("alice")
    bob = await fabrics("bob")
    await eventually(lambda: len(alice.fleet.adverts) == 2 and len(bob.fleet.adverts) == 2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    b_job = sleepy_job(60, 0.3, tmp_path / "b")
    b_run = asyncio.create_task(bob.run(b_job, Gather(), slices=8, timeout_s=60))
    await eventually(lambda: held_slices(bob, "bob") == 8, timeout_s=15)
    # When alice (equal weight, a quota of 6 slices) arrives with a job of her own
    a_job = sleepy_job(30, 0.3, tmp_path / "a")
    a_run = asyncio.create_task(alice.run(a_job, Gather(), slices=8, timeout_s=60))
    # Then within two lease TTLs each holds about half (within a slice per node)
    ttl_s = alice.settings.lease_ttl_s

    def halved() -> bool:
        a, b = held_slices(alice, "alice"), held_slices(alice, "bob")
        return a >= 3 and abs(a - b) <= 2

    await eventually(halved, timeout_s=2 * ttl_s)
    # And both jobs complete, every chunk folded exactly once (nothing lost, nothing
    # doubled); a chunk running on a lease taken back is stopped with it and runs again (a
    # slice is never leased again while an ended lease's code runs on it), with those that
    # shared its process. Taken back from bob; from alice too if she went past her share
    # (adverts lag grants: a slice per node), and then only: her chunks ran once otherwise
    a_result, b_result = await a_run, await b_run
    assert b_result.ok and [x.tolist() for x in b_result.value] == [[float(i)] for i in range(60)]
    assert a_result.ok and a_result.n_ok == 30
    assert set(executions(str(tmp_path / "b"))) == set(range(60))
    a_runs = executions(str(tmp_path / "a"))
    assert set(a_runs) == set(range(30))
    a_taken_back = [
        r
        for r in caplog.records
        if r.getMessage().startswith("chunk stopped: its lease ended")
        and f"job={a_job.job_id} " in r.getMessage()
    ]
    if not a_taken_back:
        assert a_runs == {i: 1 for i in range(30)}


async def test_tenant_b_cannot_roll_up_the_shared_jobs_bucket(
    auth_fabric: AuthFabric, connections: Any
) -> None:
    # Given alice's job spec and run record in the shared jobs bucket
    s = auth_fabric.base.subjects
    a = await connections(auth_fabric.tenant("alice"))
    b = await connections(auth_fabric.tenant("bob"))
    job = uuid.uuid4().hex[:12]
    await a.js.publish(s.job_spec("alice", job), b"alice's spec")
    await a.js.publish(s.kv_subject(s.jobs_bucket(), s.job_state_key("alice", job)), b"record")
    # When bob publishes to one of his own keys with a rollup header purging the whole bucket
    with pytest.raises(Exception) as refusal:
        await b.js.publish(s.job_spec("bob", "x"), b"", headers={"Nats-Rollup": "all"})
    # Then the server refuses it (the bucket's stream takes no rollups)
    assert "rollup" in str(refusal.value).lower()
    # And alice's keys survive, as the operator sees them
    op = await connections(auth_fabric.operator_of("alice"))
    kv = await op.js.key_value(s.jobs_bucket())
    assert (await kv.get(s.job_key("alice", job))).value == b"alice's spec"
    assert (await kv.get(s.job_state_key("alice", job))).value == b"record"


async def test_a_jobs_bucket_made_with_rollups_on_is_turned_off(
    auth_fabric: AuthFabric, connections: Any
) -> None:
    # Given a jobs bucket made the old way (nats-py's KV, which takes rollup headers)
    op_settings = attrs.evolve(auth_fabric.operator, prefix=f"u{uuid.uuid4().hex[:8]}")
    s = op_settings.subjects
    op = await connections(op_settings)
    await op.js.create_key_value(bucket=s.jobs_bucket(), history=1, direct=True)
    # When a process binds it through topology
    await buckets.jobs_bucket(op.js, op_settings)
    # Then a rollup publish to it is refused by the server
    with pytest.raises(Exception, match=r"(?i)rollup"):
        await op.js.publish(s.job_spec("bob", "x"), b"", headers={"Nats-Rollup": "all"})


def test_local_workers_get_a_policy_file_without_passwords(tmp_path: Path) -> None:
    # Given a local fleet with auth on, its tenants file holding every password
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS_TOML)
    with LocalFleet(
        workers=1, simulate="1x2GiB", slice_size="1GiB", tenants_file=str(path)
    ) as fleet:
        # When we look at what its worker process was given
        environ = Path(f"/proc/{fleet.procs[0].pid}/environ").read_bytes().decode()
        env = dict(kv.split("=", 1) for kv in environ.split("\0") if "=" in kv)
        given = Path(env["VRAMFABRIC_TENANTS"]).read_text()
    # Then no tenant's or the operator's password is in its environment or its tenants file
    for secret in ("op-secret", "alice-secret", "bob-secret"):
        assert secret not in environ and secret not in given
    # And the file still carries the policy: quotas, weights, who may run code
    policy = tenants.parse_policy(tomllib.loads(given))
    assert policy == tenants.load(path).policy
    assert policy.quota_bytes("alice") == 6 * 2**30 and policy.allows_code("alice")
    assert not policy.allows_code("bob")


async def test_worker_user_stores_large_outputs_but_cannot_read_them(
    auth_fabric: AuthFabric, connections: Any, agents: Any, fabrics: Any
) -> None:
    # Given a node whose outputs over 16 bytes go to the tenant's outputs store
    await agents("n-out", inline_output_bytes=16, allow_code=True)
    alice = await fabrics("alice")
    await eventually(lambda: bool(alice.fleet.adverts))
    # When alice runs a job with outputs larger than that
    done = await alice.run(Job(bytes, [1000, 2000]), Gather(), timeout_s=30)
    # Then the worker stored them and alice reads them back
    assert done.ok, done.failures[0].error
    assert done.value == [bytes(1000), bytes(2000)]
    # And the workers' user cannot read any of them back: not by sequence, not by subject
    s = auth_fabric.base.subjects
    store = s.outputs_store("alice")
    stream = s.object_stream(store)
    op = await connections(auth_fabric.operator_of("alice"))
    first = await op.js.get_msg(stream, 1)
    assert first.subject.startswith(f"$O.{store}.C.")
    w = await connections(auth_fabric.worker)
    # (in its own account, and through what alice's account exports to the workers)
    for js in (w.js, w.tenant_js("alice")):
        assert await refused(js.get_msg(stream, 1)) < PROMPT_S
        assert await refused(js.get_msg(stream, 1, direct=True)) < PROMPT_S
        assert await refused(js.get_msg(stream, subject=first.subject)) < PROMPT_S
        assert await refused(js.get_msg(stream, subject=first.subject, direct=True)) < PROMPT_S
        with pytest.raises(PermissionDenied):
            await js.subscribe(first.subject, stream=stream, ordered_consumer=True)

    # And a worker overwriting an object (a chunk run again) replaces it: the object reads
    # as the new one only, though the earlier chunks stay (workers may not purge the store)
    as_worker = w.tenant_js("alice")
    await write_object(as_worker, store, "again.0", b"first" * 100, chunk_bytes=256)
    await write_object(as_worker, store, "again.0", b"second" * 100, chunk_bytes=256)
    got = await (await op.js.object_store(store)).get("again.0")
    assert got.data == b"second" * 100
    info = await op.js.stream_info(stream, subjects_filter=f"$O.{store}.C.>")
    chunk_subjects = set(info.state.subjects or {})
    assert f"$O.{store}.C.{got.info.nuid}" in chunk_subjects
    assert len(chunk_subjects) == 4  # two outputs of the job, the old and new "again.0"


def test_a_cluster_with_a_tenants_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a tenants file
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS_TOML)
    # When `vramfabric server` is asked for a cluster with it
    code = cli.main(["server", "--cluster", "3", "--tenants", str(path), "--port", "-1"])
    # Then it refuses with a usage error naming both flags, instead of running with auth off
    assert code == exits.RET_USAGE == 2
    message = capsys.readouterr().err
    assert "--cluster" in message and "--tenants" in message


def test_a_worker_with_auth_on_and_no_tenants_file_refuses_to_start(
    auth_fabric: AuthFabric,
) -> None:
    # Given the workers' credentials but no VRAMFABRIC_TENANTS
    env = {k: v for k, v in os.environ.items() if k != "VRAMFABRIC_TENANTS"}
    env.update(
        VRAMFABRIC_NATS_URL=auth_fabric.base.url,
        VRAMFABRIC_PREFIX=auth_fabric.base.prefix,
        VRAMFABRIC_NATS_USER=tenants.WORKERS_USER,
        VRAMFABRIC_NATS_PASSWORD="worker-secret",
    )
    # When a worker starts
    cmd = [sys.executable, "-m", "vramfabric.worker", "--simulate", "1x2GiB", "--node", "open"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    # Then it refuses with a usage error naming the missing setting (it would fail open)
    assert done.returncode == 2, done.stderr
    assert "VRAMFABRIC_TENANTS" in done.stderr
    assert "worker ready" not in done.stdout


async def test_a_tenant_logs_in_with_an_nkey(auth_fabric: AuthFabric, tmp_path: Path) -> None:
    # Given carol's nkey seed in a file, and another seed the server does not know
    seed = tmp_path / "carol.nk"
    seed.write_bytes(CAROL_SEED)
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    s = auth_fabric.base.subjects
    carol = attrs.evolve(auth_fabric.base, user="carol", nkey_seed_file=str(seed))
    # When carol connects with hers (as VRAMFABRIC_NATS_NKEY_SEED would)
    conn = await connect(carol, name="carol")
    try:
        # Then she is carol: her own work subject takes a chunk, alice's refuses one
        ack = await conn.js.publish(s.work("carol", "job1"), b"x")
        assert ack.stream == s.work_stream("carol")
        assert await refused(conn.js.publish(s.work("alice", "job1"), b"x")) < PROMPT_S
    finally:
        await conn.close()
    # And an unknown seed is refused at connect
    with pytest.raises(PermissionDenied):
        await connect(attrs.evolve(carol, nkey_seed_file=str(stranger)), name="stranger")


async def results_left(auth_fabric: AuthFabric, connections: Any, tenant: str, job: str) -> int:
    """Results of `job` in the tenant's results stream, through the operator's JetStream API."""
    s = auth_fabric.base.subjects
    op = await connections(auth_fabric.operator_of(tenant))
    info = await op.js.stream_info(
        s.results_stream(tenant), subjects_filter=s.result_filter(tenant, job)
    )
    return len(info.state.subjects or {})


async def test_a_tenant_lists_inspects_cancels_and_removes_only_its_own_jobs(
    auth_fabric: AuthFabric, agents: Any, fabrics: Any, connections: Any
) -> None:
    # Given alice ran a job with auth on
    await agents("n-life")
    alice = await fabrics("alice")
    await eventually(lambda: bool(alice.fleet.adverts))
    done = await alice.run(sleepy_job(4, 0.0), Gather(), timeout_s=30)
    a, b = alice.broker, auth_fabric.tenant("bob")
    bob = await connections(b)
    # When she lists and inspects her jobs, as her own user
    listed = {i.job: i for i in (await joblist.list_jobs(alice.conn, a, "alice")).jobs}
    shown = await joblist.inspect(alice.conn, a, "alice", done.job_id)
    # Then she sees it done with every chunk
    assert listed[done.job_id].state == "done" and listed[done.job_id].n_ok == 4
    assert shown.state == "done" and shown.n_ok == 4 and shown.failures_by_kind == {}
    # And bob does not see it, and can neither cancel nor remove it
    assert done.job_id not in {i.job for i in (await joblist.list_jobs(bob, b, "bob")).jobs}
    for call in (lifecycle.remove, lifecycle.cancel, joblist.inspect):
        with pytest.raises(JobNotFound):
            await call(bob, b, "bob", done.job_id)
        # Naming her as the tenant reaches only his own account's bucket, or is refused
        with pytest.raises((PermissionDenied, JobNotFound)):
            await call(bob, b, "alice", done.job_id)
    assert (await joblist.inspect(alice.conn, a, "alice", done.job_id)).n_ok == 4

    # Given a long job of alice's running, its first chunks executing
    logs = Path(tempfile.mkdtemp())
    slow = sleepy_job(12, 1.5, logs)
    slow_id = slow.spec(alice.settings).job_id
    run = asyncio.create_task(alice.run(slow, Gather(), slices=2, timeout_s=60))
    await eventually(lambda: len(os.listdir(logs)) >= 2, timeout_s=20)
    # When she cancels it
    assert await lifecycle.cancel(alice.conn, a, "alice", slow_id)
    # Then her run ends as cancelled, and the job shows so
    with pytest.raises(JobCancelled):
        await run
    assert (await joblist.inspect(alice.conn, a, "alice", slow_id)).state == "cancelled"

    # When she removes both jobs
    for job in (done.job_id, slow_id):
        await lifecycle.remove(alice.conn, a, "alice", job)
    # Then they are gone for her, and her list no longer shows them
    for job in (done.job_id, slow_id):
        with pytest.raises(JobNotFound):
            await joblist.inspect(alice.conn, a, "alice", job)
    assert not {done.job_id, slow_id} & {
        i.job for i in (await joblist.list_jobs(alice.conn, a, "alice")).jobs
    }
    assert await results_left(auth_fabric, connections, "alice", done.job_id) == 0


async def test_rm_of_a_running_job_leaves_no_results_once_its_chunks_end(
    auth_fabric: AuthFabric, fabrics: Any, connections: Any, tmp_path: Path
) -> None:
    # Given a node (stopped by the test itself) and a job of alice's whose chunks execute
    settings = WorkerSettings(
        node="n-rm",
        simulate="2x2GiB",
        slice_bytes=2**30,
        heartbeat_s=0.2,
        kernel_modules=("tests.kernels_for_tests",),
        tenants_file=str(tenants.write_policy(auth_fabric.file.policy, auth_fabric.policy)),
    )
    agent = Agent(auth_fabric.worker, settings, await connect(auth_fabric.worker, name="n-rm"))
    await agent.start()
    try:
        alice = await fabrics("alice")
        await eventually(lambda: bool(alice.fleet.adverts))
        job = sleepy_job(8, 1.5, tmp_path)
        job_id = job.spec(alice.settings).job_id
        run = asyncio.create_task(alice.run(job, Gather(), slices=4, timeout_s=60))
        await eventually(lambda: len(os.listdir(tmp_path)) >= 4, timeout_s=20)
        # When she removes it while they run, and they end (the node drains them and stops)
        await lifecycle.remove(alice.conn, alice.broker, "alice", job_id)
        with pytest.raises(JobCancelled):
            await run
        await agent.stop(grace_s=10.0)
    finally:
        await agent.conn.close()
    late = await results_left(auth_fabric, connections, "alice", job_id)
    # Then a second rm removes what the chunks published after the first, and a third
    # finds nothing left
    if late:
        await lifecycle.remove(alice.conn, alice.broker, "alice", job_id)
    with pytest.raises(JobNotFound):
        await lifecycle.remove(alice.conn, alice.broker, "alice", job_id)
    assert await results_left(auth_fabric, connections, "alice", job_id) == 0


async def test_a_tenant_sees_the_fleet_with_status(auth_fabric: AuthFabric, agents: Any) -> None:
    # Given a node serving with auth on
    await agents("n-status")
    alice = auth_fabric.tenant("alice")
    env = dict(
        os.environ,
        VRAMFABRIC_NATS_URL=alice.url,
        VRAMFABRIC_PREFIX=alice.prefix,
        VRAMFABRIC_NATS_USER="alice",
        VRAMFABRIC_NATS_PASSWORD="alice-secret",
        VRAMFABRIC_TENANT="alice",
    )
    # When a tenant asks for the status, as herself
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "vramfabric", "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Then the server let her read the adverts, and the node is listed
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "n-status" in [n["node"] for n in json.loads(shown.stdout)["nodes"]]


async def test_a_tenant_deletes_a_message_of_its_own_work_stream_only(
    auth_fabric: AuthFabric, connections: Any
) -> None:
    # Given a chunk in alice's work stream (as an exhausted one stays there)
    s = auth_fabric.base.subjects
    a = await connections(auth_fabric.tenant("alice"))
    b = await connections(auth_fabric.tenant("bob"))
    ack = await a.js.publish(s.work("alice", uuid.uuid4().hex[:12]), b"chunk")
    # When bob deletes it, then alice (her coordinator records it as exhausted, then deletes)
    # Then bob is refused, and alice's delete removes it
    assert await refused(b.js.delete_msg(s.work_stream("alice"), ack.seq)) < PROMPT_S
    assert await a.js.delete_msg(s.work_stream("alice"), ack.seq)
    with pytest.raises(nats.js.errors.NotFoundError):
        await a.js.get_msg(s.work_stream("alice"), ack.seq)
