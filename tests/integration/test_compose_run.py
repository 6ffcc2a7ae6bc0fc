"""compose.yaml run for real: the README's command, a server lost mid-job, testcontainers.

On Docker with its compose plugin, or on podman as deploy/podman/setup.sh leaves it (CI runs
that first); skipped, saying why, only where neither can be had.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.compose_stack import ROOT, Engine, Stack, find_engine, job_report
from vramfabric.broker import BrokerSettings
from vramfabric.broker.errors import Disconnected, JobNotFound, PermanentError
from vramfabric.broker.subjects import Subjects
from vramfabric.broker.tls import client_context
from vramfabric.coordinator import CoordinatorSettings, Fabric
from vramfabric.demo import HYPERPARAM_RTOL, reference_argmin
from vramfabric.kernels.hyperparam import search_space

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ENGINE = find_engine()
needs_engine = pytest.mark.skipif(isinstance(ENGINE, str), reason=str(ENGINE))
N_CHUNKS = 1000
# The job a server is killed under: no packing, and few leases, so that it runs for seconds.
LONG_JOB = f"""kernel = "hyperparam_eval"
aggregate = "argmin"
job_id = "lost-server"
chunks_per_message = 1
slices = 3
[inputs]
grid = {N_CHUNKS}
"""


@pytest.fixture
def stack() -> Iterator[Stack]:
    """A compose project of its own, torn down (containers, volumes, network) afterwards."""
    assert isinstance(ENGINE, Engine)
    project = Stack(ENGINE)
    try:
        yield project
    finally:
        project.down()
        assert project.containers() == []


def readme_compose_args() -> list[str]:
    """The README's compose command, after `docker compose` (any compose client takes them)."""
    text = (ROOT / "README.md").read_text()
    (line,) = {ln.strip() for ln in text.splitlines() if ln.startswith("docker compose ")}
    return shlex.split(line)[2:]


def assert_right_answer(report: dict[str, object]) -> None:
    """The report found the direct reference's best configuration, every chunk ok."""
    assert report["ok"] == N_CHUNKS and report["failed"] == 0, report
    best, loss = reference_argmin(search_space(N_CHUNKS))
    value = report["value"]
    assert isinstance(value, list) and value[0] == best, (report, best)
    assert np.isclose(value[1], loss, rtol=HYPERPARAM_RTOL, atol=0), (report, loss)


@needs_engine
@pytest.mark.timeout(900)
def test_the_readme_compose_command_runs_the_demo_to_its_answer(stack: Stack) -> None:
    # Given the README's compose command, run as written (with the engine's compose client)
    args = readme_compose_args()
    assert "--profile" in args and "--exit-code-from" in args, args
    # When the stack builds, starts, and runs until the coordinator's job ends
    proc = stack.compose(*args, timeout_s=780)
    # Then the coordinator exits 0 with the best of 1000 configurations, every chunk ok
    assert proc.returncode == 0, stack.explain(proc)
    assert_right_answer(job_report(proc.stdout))


# The compose servers' CA, in the project's tls volume (compose-tls makes it).
CA_IN_CONTAINER = "/etc/vramfabric/tls/ca.pem"


async def fabric_on(nats_port: int, ca_file: Path, deadline: float) -> Fabric:
    """A fabric on the stack's cluster over TLS (its CA from the volume), once it has formed.

    Until it has, JetStream refuses replicated streams ('no suitable peers for placement').
    nats1's certificate names 127.0.0.1, where its client port is published.
    """
    tls = client_context(str(ca_file))
    broker = BrokerSettings(url=f"tls://127.0.0.1:{nats_port}", replicas=3, tls=tls)
    while True:
        try:
            return await Fabric.connect(broker, CoordinatorSettings.from_env({}))
        except (Disconnected, PermanentError) as exc:
            assert time.monotonic() < deadline, f"no cluster: {exc}"
            await asyncio.sleep(0.5)  # a cluster forming: nothing to await on from here


async def await_fleet(nats_port: int, ca_file: Path, n_nodes: int, timeout_s: float) -> None:
    """Return once `n_nodes` workers advertise on the stack's cluster."""
    deadline = time.monotonic() + timeout_s
    async with await fabric_on(nats_port, ca_file, deadline) as fabric:
        while len(fabric.fleet.adverts) < n_nodes:
            assert time.monotonic() < deadline, f"{len(fabric.fleet.adverts)} nodes advertise"
            await fabric.fleet.wait_changed(timeout_s=0.5)


async def progress_then_leader(nats_port: int, ca_file: Path, timeout_s: float) -> tuple[int, str]:
    """Chunks done once the job has made progress, and which server leads its work stream."""
    deadline = time.monotonic() + timeout_s
    async with await fabric_on(nats_port, ca_file, deadline) as fabric:
        while True:
            try:
                status = await fabric.job("lost-server").status()
            except JobNotFound:
                status = None
            if status is not None and status.n_done >= 50:
                break
            assert time.monotonic() < deadline, f"no progress within {timeout_s}s: {status}"
            await asyncio.sleep(0.1)  # polling another process's job: nothing to await on
        stream = Subjects(fabric.broker.prefix).work_stream(fabric.settings.tenant)
        info = await fabric.conn.js.stream_info(stream)
        assert info.cluster is not None and info.cluster.leader, info
        return status.n_done, info.cluster.leader


@needs_engine
@pytest.mark.timeout(900)
def test_a_nats_server_killed_mid_job_loses_no_chunk(stack: Stack, tmp_path: Path) -> None:
    # Given the 3-server cluster and two simulated workers, up
    up = stack.compose(
        "--profile", "simulated", "up", "-d", "--build", "nats1", "nats2", "nats3", "worker-sim",
        timeout_s=600,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr[-3000:]
    ca_file = stack.copy_out("nats1", CA_IN_CONTAINER, tmp_path / "ca.pem")
    asyncio.run(await_fleet(stack.nats_port, ca_file, n_nodes=2, timeout_s=300))
    # And TLS on: the client port (published here) asks for it before anything else
    assert '"tls_required":true' in first_line("127.0.0.1", stack.nats_port)
    # And a peer's route port speaks TLS only, to a peer with a certificate the CA signed
    route = stack.exec("nats1", "python3", "-c", ROUTE_PROBE)
    assert route.returncode == 0, route
    plain, stranger, peer = route.stdout.splitlines()
    assert plain == "b''", route.stdout  # closed: nothing said in plain
    assert "CERTIFICATE_REQUIRED" in stranger, route.stdout
    assert peer.startswith("b'INFO ") and '"tls_required":true' in peer, route.stdout
    # And a coordinator container running a job that lasts seconds (started as itself: a
    # failure of its own is not run again, as await-nats would)
    job = tmp_path / "lost-server.toml"
    job.write_text(LONG_JOB)
    job.chmod(0o644)
    target = "/etc/vramfabric/lost-server.toml"
    mount = f"{job}:{target}:ro"
    run = ["run", "--rm", "-v", mount, "--entrypoint", "vramfabric", "coordinator"]
    run += ["run", target, "--json"]
    coordinator = stack.start("--profile", "simulated", *run)
    try:
        # When the server leading its work stream is killed mid-job
        n_done, leader = asyncio.run(progress_then_leader(stack.nats_port, ca_file, timeout_s=300))
        assert n_done < N_CHUNKS, "the job ended before a server could be killed"
        killed = stack.compose("kill", leader, timeout_s=120)
        assert killed.returncode == 0, killed.stderr
        out, err = coordinator.communicate(timeout=420)
    finally:
        coordinator.kill()
        coordinator.communicate()
    # Then the job still ends with every chunk's result, and the right answer
    assert coordinator.returncode == 0, (out[-3000:], err[-3000:])
    assert_right_answer(job_report(out))
    # And it ended on two servers: the killed one never came back
    running = stack.containers("status=running")
    assert not [c for c in running if leader in c], running


# Run in nats1's container: what nats2's route port says to a plain client, to a TLS client
# with the CA only (a stranger), and to one with nats1's certificate (a peer).
ROUTE_PROBE = """
import socket, ssl
def first(tls, cert):
    try:
        with socket.create_connection(("nats2", 6222), 20) as raw:
            if not tls:
                return raw.recv(4096)
            context = ssl.create_default_context(cafile="/etc/vramfabric/tls/ca.pem")
            if cert:
                context.load_cert_chain(
                    "/etc/vramfabric/tls/nats1.pem", "/etc/vramfabric/tls/nats1-key.pem"
                )
            with context.wrap_socket(raw, server_hostname="nats2") as sock:
                return sock.recv(4096)[:300]
    except OSError as exc:
        return repr(exc)
for tls, cert in ((False, False), (True, False), (True, True)):
    print(first(tls, cert))
"""


def first_line(host: str, port: int) -> str:
    """What a NATS listener says first to a plain TCP client (its INFO)."""
    with socket.create_connection((host, port), timeout=20) as sock:
        return sock.recv(65536).split(b"\r\n")[0].decode()


def start_podman_service(socket_path: Path) -> subprocess.Popen[bytes]:
    """Podman's Docker-compatible API on a socket of its own, answering."""
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{socket_path}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import docker

    deadline = time.monotonic() + 60
    while True:
        try:
            client = docker.DockerClient(base_url=f"unix://{socket_path}", timeout=5)
            try:
                if client.ping():
                    return service
            finally:
                client.close()
        except Exception:  # docker.errors.DockerException: not listening yet (polled again)
            assert time.monotonic() < deadline and service.poll() is None, "no podman API"
            time.sleep(0.2)  # a service starting: nothing to wait on but its socket


# tests/conftest.py's NATS server comes from testcontainers whenever an engine answers; these
# tests (a JetStream round trip, a job on a fleet) then run against a container.
TESTCONTAINERS_TESTS = [
    "tests/integration/test_acked.py",
    "tests/integration/test_ready.py::test_a_job_sent_at_ready_runs_every_chunk_on_every_gpu",
]


@needs_engine
@pytest.mark.timeout(600)
def test_the_testcontainers_fixture_chain_runs_on_the_engine() -> None:
    assert isinstance(ENGINE, Engine)
    if ENGINE.cli == "docker":
        pytest.skip("Docker answers: the whole suite's NATS server is a testcontainer already")
    # Given podman's Docker-compatible API, and the time before anything runs
    since = subprocess.run(["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"], capture_output=True, text=True)
    with tempfile.TemporaryDirectory(prefix="vfpodman") as folder:
        service = start_podman_service(Path(folder) / "podman.sock")
        try:
            # When integration tests run with DOCKER_HOST pointing at it
            env = {
                "DOCKER_HOST": f"unix://{folder}/podman.sock",
                # Ryuk, testcontainers' reaper, is an image of its own: the fixture stops its
                # container itself.
                "TESTCONTAINERS_RYUK_DISABLED": "true",
                # The engine runs on this host: its ports are reached here, even where the
                # host looks like a container (a /.dockerenv, as on this project's machines).
                "TESTCONTAINERS_CONNECTION_MODE": "docker_host",
                **ENGINE.env,
            }
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 *TESTCONTAINERS_TESTS],
                cwd=ROOT,
                env={**_without_nats_url(), **env},
                capture_output=True,
                text=True,
                timeout=480,
            )  # fmt: skip
        finally:
            service.terminate()
            service.wait(timeout=60)
    # Then they pass, none skipped
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "4 passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
    # And their server was a NATS container the fixture started (and removed)
    events = subprocess.run(
        ["podman", "events", "--stream=false", "--since", since.stdout.strip(),
         "--filter", "type=container", "--filter", "event=start", "--format", "{{.Image}}"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert "nats:latest" in events.stdout, events.stdout + events.stderr


def _without_nats_url() -> dict[str, str]:
    """This process's environment less a server URL that would bypass testcontainers."""
    return {k: v for k, v in os.environ.items() if k != "VRAMFABRIC_NATS_URL"}
