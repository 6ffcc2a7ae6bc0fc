"""Chaos harness: a fabric of real processes, one fault injected mid-job, and the bookkeeping.

Shared by tests/chaos (one run per scenario) and bench/chaos.py (many runs, JSON lines).
Every run checks the same promises: the job completes, no chunk is lost, no chunk is
aggregated twice, and no lease outlives its TTL plus one heartbeat.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs

from tests.helpers import eventually
from tests.kernels_for_tests import SLEEPY, executions, sleepy_input
from vramfabric.broker import BrokerSettings, NatsServer, RetryPolicy, auth
from vramfabric.broker.cluster import LocalCluster
from vramfabric.broker.server import die_with_parent
from vramfabric.broker.subjects import Subjects
from vramfabric.broker.tenants import OPERATOR_USER, TenantsFile
from vramfabric.broker.tenants import load as load_tenants
from vramfabric.coordinator import CoordinatorSettings, Fabric, Fold, Job
from vramfabric.local import LocalFleet, demo_tenants_file

HEARTBEAT_S = 0.5
NODE_TTL_S = 2.0
LEASE_TTL_S = 3.0
ACK_WAIT_S = 1.0
# A drain's promise is that nothing runs twice: with a 1 s ack wait, a worker starved that long
# on a loaded machine has a chunk delivered again, which at-least-once allows in any scenario
# (seen once in CI beside two busy loops). The drain runs with an ack wait no load here
# reaches; a running chunk the drain stopped is still seen, since it is nak'd and runs again
# at once.
DRAIN_ACK_WAIT_S = 10.0
RETRY = RetryPolicy(max_retries=8, initial_backoff_s=0.1, max_backoff_s=1.0)
# The coordinators' tenant with auth on (with auth off they use the default tenant).
TENANT = "chaos"
SCENARIOS = (
    "worker_kill",
    "coordinator_kill",
    "server_kill",
    "server_restart",
    "worker_freeze",
    "worker_drain",
)


@attrs.define
class Outcome:
    """What one run of a scenario measured."""

    scenario: str
    auth: bool = False
    completed: bool = False
    chunks: int = 0
    lost: int = 0
    aggregated_twice: int = 0
    re_executions: int = 0
    in_flight_at_fault: int = 0
    longest_stall_s: float = 0.0
    lease_cleanup_s: float = 0.0
    lease_bound_s: float = 0.0
    worker_exit: int | None = None
    error: str = ""


SLICES = 64


def chaos_job(n: int, log_dir: str, job_id: str = "") -> Job:
    """N sleepy chunks (2 ms each) that log every execution to `log_dir`."""
    return Job(
        SLEEPY,
        [sleepy_input(i) for i in range(n)],
        args={"sleep_s": 0.002, "log_dir": log_dir},
        retry=RETRY,
        job_id=job_id,
    )


def chaos_settings(tenant: str = "default", ack_wait_s: float = ACK_WAIT_S) -> CoordinatorSettings:
    """Coordinator settings with chaos-sized timeouts, for `tenant`."""
    return CoordinatorSettings(
        tenant=tenant,
        slice_bytes=256 * 2**20,
        lease_ttl_s=LEASE_TTL_S,
        ack_wait_s=ack_wait_s,
        max_slices=SLICES,
    )


def count_each() -> Fold:
    """An aggregator that counts how often each chunk index was folded in."""

    def fold(state: dict[int, int], index: int, _output: bytes) -> dict[int, int]:
        state[index] = state.get(index, 0) + 1
        return state

    return Fold(fold, {})


@attrs.define
class Fabricated:
    """The processes of one run: a server or cluster, worker subprocesses, a log folder.

    With `auth` on, the servers run with a config generated from a fresh tenants file: the
    workers connect as the workers' user, the coordinators as tenant `TENANT`.
    """

    cluster: bool
    workers: int
    auth: bool = False
    prefix: str = attrs.field(factory=lambda: f"c{uuid.uuid4().hex[:8]}")
    server: NatsServer | LocalCluster | None = None
    fleet: LocalFleet | None = None
    log_dir: str = attrs.field(factory=lambda: tempfile.mkdtemp(prefix="vf-chaos-"))
    users: TenantsFile | None = None
    _auth_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def tenant(self) -> str:
        """The coordinators' tenant."""
        return TENANT if self.auth else "default"

    @property
    def _plain(self) -> BrokerSettings:
        assert self.server is not None
        return BrokerSettings(
            url=self.server.url,
            prefix=self.prefix,
            node_ttl_s=NODE_TTL_S,
            replicas=3 if self.cluster else 1,
            request_timeout_s=1.0,
        )

    @property
    def broker(self) -> BrokerSettings:
        """The coordinators' client settings for this run (the tenant's user with auth on)."""
        if self.users is None:
            return self._plain
        return auth.settings_for(self._plain, TENANT, self.users.tenant(TENANT).credential.password)

    async def start(self) -> None:
        """Start the servers and the workers, and wait until they serve."""
        tenants_file = None
        if self.auth:
            self._auth_dir = tempfile.TemporaryDirectory(prefix="vf-chaos-auth-")
            tenants_file = str(demo_tenants_file(Path(self._auth_dir.name) / "t.toml", (TENANT,)))
            self.users = load_tenants(tenants_file)
        operator = (OPERATOR_USER, self.users.operator.password) if self.users else None
        if self.cluster:
            extra = ""
            if self.users is not None:
                accounts = auth.accounts(self.users, Subjects(self.prefix))
                extra = f"accounts: {json.dumps(accounts)}\n"
            self.server = LocalCluster(size=3, extra_config=extra).start()
            user, password = operator or (None, None)
            await self.server.wait_jetstream(user=user, password=password)
        elif self.users is not None and self._auth_dir is not None:
            config = Path(self._auth_dir.name) / "server.json"
            auth.write_config(self.users, Subjects(self.prefix), config, port=-1)
            self.server = NatsServer(config_file=str(config)).start()
        else:
            self.server = NatsServer().start()
        if self.users is not None and operator is not None:
            await auth.provision_tenants(auth.settings_for(self._plain, *operator), self.users)
        self.fleet = LocalFleet(
            workers=self.workers,
            simulate="1x8GiB",
            slice_size="256MiB",
            prefix=self.prefix,
            url=self.server.url,
            node_ttl_s=NODE_TTL_S,
            replicas=3 if self.cluster else 1,
            tenants_file=tenants_file,
            worker_args=(
                "--kernel-module",
                "tests.kernels_for_tests",
                "--heartbeat-s",
                str(HEARTBEAT_S),
            ),
        )
        await asyncio.to_thread(self.fleet.start)

    def job(self, n: int, job_id: str = "") -> Job:
        """The run's job (see `chaos_job`)."""
        return chaos_job(n, self.log_dir, job_id)

    def executed(self) -> int:
        """Executions so far, over all chunks."""
        return sum(executions(self.log_dir).values())

    def stop(self) -> None:
        """Stop everything this run started."""
        if self.fleet is not None:
            self.fleet.stop(timeout_s=5)
        if self.server is not None:
            self.server.stop()
        if self._auth_dir is not None:
            self._auth_dir.cleanup()
        for name in os.listdir(self.log_dir):
            os.unlink(os.path.join(self.log_dir, name))
        os.rmdir(self.log_dir)


async def wait_executed(fab: Fabricated, at_least: int, timeout_s: float = 60) -> None:
    """Poll the execution log until `at_least` chunks ran (AssertionError at the deadline)."""
    await eventually(lambda: fab.executed() >= at_least, timeout_s=timeout_s, interval_s=0.01)


async def leases_clear(fabric: Fabric, deadline_s: float) -> float:
    """Seconds until every advert shows no leased VRAM; inf if the deadline passes first."""
    t0 = time.monotonic()
    while True:
        if all(g.leased_bytes == 0 for a in fabric.fleet.adverts.values() for g in a.gpus):
            return time.monotonic() - t0
        if time.monotonic() - t0 > deadline_s:
            return float("inf")
        await fabric.fleet.wait_changed(timeout_s=0.2)


Fault = Callable[[Fabricated, "Outcome"], Awaitable[int]]


async def run_scenario(
    scenario: str, n: int = 1000, seed: int | None = None, with_auth: bool = False
) -> Outcome:
    """Run one scenario once; never raises for a broken promise, reports it instead."""
    rng = random.Random(seed)
    fab = Fabricated(cluster=scenario == "server_kill", workers=4, auth=with_auth)
    outcome = Outcome(scenario=scenario, auth=with_auth, chunks=n)
    try:
        await fab.start()
        if scenario == "coordinator_kill":
            await _coordinator_kill(fab, n, rng, outcome)
        else:
            await _in_process(fab, n, rng, outcome, FAULTS[scenario])
    except Exception as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        await asyncio.to_thread(fab.stop)
    return outcome


async def _in_process(
    fab: Fabricated, n: int, rng: random.Random, outcome: Outcome, fault: Fault
) -> None:
    stamps: list[float] = []
    ack_wait_s = DRAIN_ACK_WAIT_S if outcome.scenario == "worker_drain" else ACK_WAIT_S
    settings = chaos_settings(fab.tenant, ack_wait_s)
    async with await Fabric.connect(fab.broker, settings) as fabric:
        aggregator = count_each()
        run = asyncio.create_task(
            fabric.run(
                fab.job(n),
                aggregator,
                slices=64,
                timeout_s=120,
                progress=lambda _r: stamps.append(time.monotonic()),
            )
        )
        await wait_executed(fab, int(n * rng.uniform(0.2, 0.8)))
        fault_at = time.monotonic()
        outcome.in_flight_at_fault = await fault(fab, outcome)
        result = await run
        outcome.lease_bound_s = LEASE_TTL_S + HEARTBEAT_S
        outcome.lease_cleanup_s = await leases_clear(fabric, 3 * outcome.lease_bound_s)
        _account(outcome, fab, result.n_ok, aggregator.value(), stamps, fault_at)


def _account(
    outcome: Outcome,
    fab: Fabricated,
    n_ok: int,
    counts: dict[int, int],
    stamps: list[float],
    fault_at: float,
) -> None:
    outcome.completed = n_ok == outcome.chunks
    outcome.lost = outcome.chunks - len(counts)
    outcome.aggregated_twice = sum(1 for c in counts.values() if c > 1)
    outcome.re_executions = fab.executed() - outcome.chunks
    after = [t for t in stamps if t >= fault_at]
    gaps = [b - a for a, b in zip([fault_at, *after], after, strict=False)]
    outcome.longest_stall_s = round(max(gaps, default=0.0), 3)


async def _kill_worker(fab: Fabricated, _outcome: Outcome) -> int:
    assert fab.fleet is not None
    victim = random.choice(fab.fleet.procs)
    os.kill(victim.pid, signal.SIGKILL)
    return 1


async def _freeze_worker(fab: Fabricated, _outcome: Outcome) -> int:
    assert fab.fleet is not None
    victim = random.choice(fab.fleet.procs)
    os.kill(victim.pid, signal.SIGSTOP)
    # Frozen well past the ack wait and the node TTL, then thawed: its late results must
    # be rejected as duplicates, and its leases reaped.
    await asyncio.sleep(ACK_WAIT_S + NODE_TTL_S + 1.0)  # the fault itself: a frozen process
    os.kill(victim.pid, signal.SIGCONT)
    return 1


async def _kill_server(fab: Fabricated, _outcome: Outcome) -> int:
    assert isinstance(fab.server, LocalCluster)
    fab.server.kill(random.randrange(3))
    return 0


async def _restart_server(fab: Fabricated, _outcome: Outcome) -> int:
    assert isinstance(fab.server, NatsServer)
    fab.server.kill()
    fab.server.start()
    return 0


async def _drain_worker(fab: Fabricated, outcome: Outcome) -> int:
    assert fab.fleet is not None
    victim = random.choice(fab.fleet.procs)
    victim.send_signal(signal.SIGTERM)
    # A draining worker finishes its chunks, naks the rest, releases and exits 0.
    outcome.worker_exit = await asyncio.to_thread(victim.wait, 30)
    return 0


FAULTS: dict[str, Fault] = {
    "worker_drain": _drain_worker,
    "worker_kill": _kill_worker,
    "worker_freeze": _freeze_worker,
    "server_kill": _kill_server,
    "server_restart": _restart_server,
}


async def _coordinator_kill(fab: Fabricated, n: int, rng: random.Random, outcome: Outcome) -> None:
    """Kill -9 a coordinator process about half-way, then rerun the same job id in-process."""
    job_id = f"chaos{uuid.uuid4().hex[:8]}"
    b = fab.broker
    # Settings and credentials travel in the environment, never on a command line.
    env = dict(
        os.environ,
        VRAMFABRIC_NATS_URL=b.url,
        VRAMFABRIC_PREFIX=b.prefix,
        VRAMFABRIC_REPLICAS=str(b.replicas),
        VRAMFABRIC_NODE_TTL_S=str(b.node_ttl_s),
        VRAMFABRIC_TENANT=fab.tenant,
    )
    if b.user is not None:
        env.update(VRAMFABRIC_NATS_USER=b.user, VRAMFABRIC_NATS_PASSWORD=b.password or "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.chaos.coordinator_proc", str(n), job_id, fab.log_dir],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )
    try:
        await wait_executed(fab, int(n * rng.uniform(0.4, 0.6)))
        os.kill(proc.pid, signal.SIGKILL)
        fault_at = time.monotonic()
    finally:
        proc.wait()
    stamps: list[float] = []
    ack_wait_s = DRAIN_ACK_WAIT_S if outcome.scenario == "worker_drain" else ACK_WAIT_S
    settings = chaos_settings(fab.tenant, ack_wait_s)
    async with await Fabric.connect(fab.broker, settings) as fabric:
        aggregator = count_each()
        result = await fabric.run(
            fab.job(n, job_id),
            aggregator,
            slices=SLICES,
            timeout_s=120,
            progress=lambda _r: stamps.append(time.monotonic()),
        )
        # The dead coordinator's leases expire on their own, TTL after their last renewal:
        # measure from the kill how long until no advert shows a lease.
        outcome.lease_bound_s = LEASE_TTL_S + HEARTBEAT_S
        await leases_clear(fabric, 3 * outcome.lease_bound_s)
        outcome.lease_cleanup_s = round(time.monotonic() - fault_at, 3)
        # Chunks in flight at the kill are bounded by the leases the dead coordinator held.
        outcome.in_flight_at_fault = SLICES
        _account(outcome, fab, result.n_ok, aggregator.value(), stamps, fault_at)


def as_json(outcome: Outcome) -> dict[str, Any]:
    """The outcome as a JSON-ready dict."""
    return attrs.asdict(outcome)
