"""The fabric a JupyterHub test runs against: auth on, as an operator runs it.

`vramfabric server --tenants FILE` (which follows the file: the hub adds tenants to it) and
one worker with `--allow-code`, as subprocesses on loopback.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import attrs

from tests.helpers import wait_for_line

OPERATOR_PASSWORD = "op-secret"
WORKERS_PASSWORD = "workers-secret"
# The tenants file needs one tenant to start with: the course's staff.
TENANTS_TOML = f"""
[operator]
password = "{OPERATOR_PASSWORD}"
[workers]
password = "{WORKERS_PASSWORD}"
[tenants.staff]
password = "staff-secret"
allow_code = true
"""
# One simulated GPU of 16 slices, running tenants' code.
WORKER_ARGS = [
    "worker",
    "--simulate",
    "1x8GiB",
    "--slice",
    "512MiB",
    "--allow-code",
    # Tenants' code as this worker's uid: this test machine's Python (a pyenv under /root)
    # is not readable by other uids, so the worker fails closed without it.
    "--allow-shared-uid",
    "--heartbeat-s",
    "0.5",
    # Its log (shown when a test fails) tells leases granted and reconnects, not only warnings.
    "-v",
]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any VRAMFABRIC_* setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMFABRIC_")}
    # The venv's scripts (jupyterhub-singleuser, configurable-http-proxy) come first.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def free_port() -> int:
    """A loopback port free at this moment: the hub config names its ports before they start."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.define
class Fabric:
    """`vramfabric server --tenants` and one worker that runs code, as subprocesses."""

    folder: Path
    prefix: str = attrs.field(factory=lambda: f"h{uuid.uuid4().hex[:8]}")
    url: str = ""
    procs: list[subprocess.Popen[str]] = attrs.field(factory=list)

    @property
    def tenants_file(self) -> Path:
        """The tenants file the server follows (the hub adds to it)."""
        return self.folder / "tenants.toml"

    def start(self) -> Fabric:
        """Launch the server on a free port (its URL is known at once; see `wait_ready`)."""
        self.tenants_file.write_text(TENANTS_TOML)
        self.tenants_file.chmod(0o600)
        port = free_port()
        self.url = f"nats://127.0.0.1:{port}"
        self._spawn(
            ["server", "--port", str(port), "--tenants", str(self.tenants_file)],
            clean_env(VRAMFABRIC_PREFIX=self.prefix),
        )
        return self

    def wait_server(self) -> str:
        """Wait until the server serves; the path of the workers' policy file it writes."""
        ready = wait_for_line(self.procs[0].stdout, "nats-server ready", timeout_s=60)
        return ready.split("VRAMFABRIC_TENANTS=")[1].split()[0]

    def wait_ready(self) -> None:
        """Wait until the server serves, then start the worker and wait until it serves."""
        policy = self.wait_server()
        worker = self._spawn(
            [*WORKER_ARGS, "--node", "hub-node"],
            self.env("vf_workers", WORKERS_PASSWORD, VRAMFABRIC_TENANTS=policy),
        )
        wait_for_line(worker.stdout, "worker ready", timeout_s=60)

    def env(self, user: str, password: str, **extra: str) -> dict[str, str]:
        """The environment of a client of this fabric logging in as `user`."""
        return clean_env(
            VRAMFABRIC_NATS_URL=self.url,
            VRAMFABRIC_PREFIX=self.prefix,
            VRAMFABRIC_NATS_USER=user,
            VRAMFABRIC_NATS_PASSWORD=password,
            **extra,
        )

    def _spawn(self, args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        with open(self.folder / f"{args[0]}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "vramfabric", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self.procs.append(proc)
        return proc

    def tail(self, n_chars: int = 3000) -> str:
        """The end of the server's and the worker's logs."""
        logs = [self.folder / "server.log", self.folder / "worker.log"]
        return "\n".join(
            f"{p.name}: {p.read_text(errors='replace')[-n_chars:]}" for p in logs if p.exists()
        )

    def stop(self) -> None:
        """SIGTERM the worker, then the server; kill what does not stop."""
        for proc in reversed(self.procs):
            stop_process(proc)


def stop_process(
    proc: subprocess.Popen[str] | subprocess.Popen[bytes], timeout_s: float = 15
) -> None:
    """SIGTERM `proc` and wait; SIGKILL it if it does not end in time; close its pipe."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
