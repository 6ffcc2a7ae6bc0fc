"""Tenants' code cannot touch the node: each tenant's executors run as a uid of their own.

A real worker (a subprocess, as root) runs Python functions for two tenants; the functions
report what they can see and do, and the tests assert what a tenant would find.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import eventually, wait_for_line
from tests.integration.conftest import FabricFactory
from vramfabric.broker import BrokerSettings
from vramfabric.coordinator import Gather, Job
from vramfabric.worker.executors.containment import CONTAINED, obstacle
from vramfabric.worker.executors.start import EXECUTOR_SETTINGS
from vramfabric.worker.node.uids import DEFAULT_UIDS

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uid switching: Linux only"),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="executors switch uids only under root (the tests run as root)"
    ),
]

SECRET = "hunter2-not-for-tenants"
# Checks whether the interpreter it runs on can be used by executors of the default uids.
CHECK = (
    "from vramfabric.worker.executors.containment import obstacle; "
    "from vramfabric.worker.node.uids import DEFAULT_UIDS; "
    "print(obstacle(DEFAULT_UIDS))"
)


def attempt(action: Callable[[], object]) -> str:
    """Run `action` in the executor: "ok", or the name of the exception it raised."""
    try:
        action()
    except Exception as exc:
        return type(exc).__name__
    return "ok"


def write_and_remove(path: str) -> None:
    """Create `path`, then remove it again (a write that should not have worked leaves nothing)."""
    with open(path, "w") as f:
        f.write("import os\n")
    os.remove(path)


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Run as a tenant's function: who am I, where am I, and what may I do to others."""
    import os
    import stat
    import sysconfig
    from pathlib import Path

    cwd = os.getcwd()
    info = os.stat(cwd)
    seen: dict[str, Any] = {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": os.getgroups(),
        "pid": os.getpid(),
        "cwd": cwd,
        "cwd_mode": stat.S_IMODE(info.st_mode),
        "cwd_owner": info.st_uid,
        "home": os.environ.get("HOME"),
        "tmpdir": os.environ.get("TMPDIR"),
        "env": dict(os.environ),
    }
    agent = spec["agent"]
    seen["read_agent_environ"] = attempt(Path(f"/proc/{agent}/environ").read_bytes)
    seen["signal_agent"] = attempt(lambda: os.kill(agent, 0))
    purelib = sysconfig.get_paths()["purelib"]
    seen["write_pth"] = attempt(lambda: write_and_remove(os.path.join(purelib, "vf-probe.pth")))
    # A file of its own: the tenant's other process writes in the same directory meanwhile.
    mine = os.path.join(cwd, f"mine-{os.getpid()}")
    seen["write_own_dir"] = attempt(lambda: write_and_remove(mine))
    other = spec.get("other")
    if other:
        seen["other_alive"] = os.path.exists(f"/proc/{other['pid']}")
        seen["signal_other"] = attempt(lambda: os.kill(other["pid"], 0))
        target = os.path.join(other["cwd"], f"from-{os.getpid()}")
        seen["write_other_dir"] = attempt(lambda: write_and_remove(target))
    return seen


@pytest.fixture(scope="session")
def contained_python() -> Iterator[str]:
    """An interpreter executors of other uids can run: this one, or a venv of a system one.

    A Python installed under a private home (pyenv in /root) is out of their reach; a venv
    of the system's Python of the same version, seeing this environment's packages, is not.
    """
    if not obstacle(DEFAULT_UIDS):
        yield sys.executable
        return
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(f"python{version}", path="/usr/local/bin:/usr/bin")
    if system is None:
        pytest.skip(f"{sys.executable} is unreachable by other uids and no system python{version}")
    base = tempfile.mkdtemp(prefix="vf-contained-")
    try:
        os.chmod(base, 0o755)
        venv = Path(base, "venv")
        subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next(venv.glob("lib/python*/site-packages"))
        purelib = Path(sys.modules["attrs"].__file__ or "").parent.parent
        (site / "vf-test.pth").write_text(f"import site; site.addsitedir({str(purelib)!r})\n")
        python = str(venv / "bin" / "python")
        why = subprocess.run([python, "-c", CHECK], capture_output=True, text=True, check=True)
        if why.stdout.strip():
            pytest.skip(f"no interpreter other uids can run here: {why.stdout.strip()}")
        yield python
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def worker(
    broker: BrokerSettings, contained_python: str, tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A worker process running tenants' code, one executor process per lease, as root."""
    env = dict(
        os.environ,
        VRAMFABRIC_NATS_URL=broker.url,
        VRAMFABRIC_PREFIX=broker.prefix,
        VRAMFABRIC_NODE_TTL_S=str(broker.node_ttl_s),
        VRAMFABRIC_NATS_PASSWORD=SECRET,
        VRAMFABRIC_ISOLATION="process",
    )
    cmd = [contained_python, "-m", "vramfabric.worker", "--simulate", "1x4GiB", "--slice", "1GiB"]
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [*cmd, "--node", "jail", "--allow-code", "-v"], env=env, stdout=subprocess.PIPE, stderr=log
    )
    try:
        wait_for_line(proc.stdout, "worker ready", timeout_s=30)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        log.close()


async def run_probes(
    fabric_factory: FabricFactory, agent: int, tenant: str, other: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Run `probe` on two leases (two executor processes) for `tenant`."""
    fabric = await fabric_factory(tenant=tenant)
    await eventually(lambda: "jail" in fabric.fleet.adverts, timeout_s=10)
    spec = {"agent": agent, "other": other}
    done = await fabric.run(Job(probe, [spec, spec]), Gather(), slices=2, timeout_s=60)
    assert done.ok, done.failures[0].error
    return list(done.value)


async def test_each_tenant_runs_as_a_uid_of_its_own_in_a_private_directory(
    worker: subprocess.Popen[bytes], fabric_factory: FabricFactory
) -> None:
    # Given a root worker running tenants' code
    # When two tenants each run a function on two leases (two executor processes each)
    alpha = await run_probes(fabric_factory, worker.pid, "alpha")
    beta = await run_probes(fabric_factory, worker.pid, "beta")
    # Then one tenant's processes share one uid, not root's, and the tenants' uids differ
    assert len({p["pid"] for p in alpha}) == 2
    assert len({p["uid"] for p in alpha}) == 1 and len({p["uid"] for p in beta}) == 1
    assert alpha[0]["uid"] != 0 and beta[0]["uid"] != 0
    assert alpha[0]["uid"] != beta[0]["uid"]
    for seen in alpha + beta:
        # And each runs with its own gid, no supplementary groups, in a private directory
        assert seen["gid"] == seen["uid"] and seen["groups"] == []
        assert seen["cwd_owner"] == seen["uid"] and seen["cwd_mode"] == 0o700
        assert seen["home"] == seen["cwd"] and seen["tmpdir"].startswith(seen["cwd"] + "/")
        assert seen["write_own_dir"] == "ok"
        # And its environment carries none of the worker's settings or secrets (only those
        # the agent sets for executors: the host path's folders, the compile check off)
        assert not [
            k for k in seen["env"] if k.startswith("VRAMFABRIC_") and k not in EXECUTOR_SETTINGS
        ]
        assert "VRAMFABRIC_HOST_CACHE" not in seen["env"]  # a contained one builds in its own
        assert SECRET not in repr(seen["env"])
    assert alpha[0]["cwd"] != beta[0]["cwd"]


async def test_tenants_code_cannot_read_signal_or_write_the_node_or_each_other(
    worker: subprocess.Popen[bytes], fabric_factory: FabricFactory
) -> None:
    # Given tenant alpha's executors, kept alive (idle) after its job
    alpha = await run_probes(fabric_factory, worker.pid, "alpha")
    # When tenant beta's function goes after the agent, the installed packages and alpha
    beta = await run_probes(fabric_factory, worker.pid, "beta", other=alpha[0])
    # Then the agent's environment (its NATS password) cannot be read, nor the agent signalled
    for seen in alpha + beta:
        assert seen["read_agent_environ"] == "PermissionError"
        assert seen["signal_agent"] == "PermissionError"
        # And no .pth can be planted in site-packages for every later executor to run
        assert seen["write_pth"] == "PermissionError"
    for seen in beta:
        # And alpha's live executor cannot be signalled, nor its directory written
        assert seen["other_alive"], "alpha's executor was gone before beta's probe ran"
        assert seen["signal_other"] == "PermissionError"
        assert seen["write_other_dir"] == "PermissionError"


async def test_the_nodes_advert_says_its_executors_run_one_uid_per_tenant(
    worker: subprocess.Popen[bytes], fabric_factory: FabricFactory
) -> None:
    # Given a root worker
    # When a coordinator sees its advert
    fabric = await fabric_factory()
    await eventually(lambda: "jail" in fabric.fleet.adverts, timeout_s=10)
    # Then the advert carries the containment (what `vramfabric status` shows)
    assert fabric.fleet.adverts["jail"].containment == CONTAINED
