"""compose.yaml on a real container engine: Docker with its compose plugin, or podman.

deploy/podman/setup.sh (which .ci/run calls) installs podman and a compose client, makes a
base image offline and writes their names to CACHE/env once they are ready; tests skip, saying
why, only where neither engine can be had.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import attrs

from tests.conftest import docker_available

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("VRAMFABRIC_PODMAN_CACHE", "/var/cache/vramfabric-podman"))


@attrs.frozen
class Engine:
    """How to run compose.yaml here: the compose command, the container CLI, settings."""

    compose: tuple[str, ...]
    cli: str
    env: dict[str, str]


def _answers(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_engine() -> Engine | str:
    """The engine compose.yaml runs on here, or why there is none."""
    if docker_available() and shutil.which("docker") and _answers(["docker", "compose", "version"]):
        return Engine(("docker", "compose"), "docker", {})
    settings = CACHE / "env"
    if shutil.which("podman") and settings.exists():
        env = dict(line.split("=", 1) for line in settings.read_text().splitlines() if "=" in line)
        return Engine((env.pop("PODMAN_COMPOSE"),), "podman", env)
    log = CACHE / "setup.log"
    last = log.read_text().strip().splitlines()[-1:] if log.exists() else []
    return (
        "no container engine: no Docker engine with its compose plugin, and podman is not set up"
        f" (deploy/podman/setup.sh, as root; {log}: {last[0] if last else 'no log'})"
    )


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job_report(output: str) -> dict[str, Any]:
    """The last job report (`vramfabric run --json`) in a compose client's merged output.

    Each line starts with its container's name, as each client writes it; the report follows.
    """
    lines = [line for line in output.splitlines() if '"job_id"' in line]
    assert lines, f"no job report in the output: {output[-3000:]}"
    report = json.loads(lines[-1][lines[-1].index("{") :])
    assert isinstance(report, dict)
    return report


@attrs.define
class Stack:
    """One project of compose.yaml, under a name and host ports of its own."""

    engine: Engine
    name: str = attrs.field(factory=lambda: f"vf{uuid.uuid4().hex[:8]}")
    nats_port: int = attrs.field(factory=free_port)

    @property
    def env(self) -> dict[str, str]:
        """The environment compose runs in: this project's name and ports, the engine's settings."""
        return {
            **os.environ,
            **self.engine.env,
            "COMPOSE_PROJECT_NAME": self.name,
            "VRAMFABRIC_NATS_PORT": str(self.nats_port),
            "VRAMFABRIC_PROMETHEUS_PORT": str(free_port()),
        }

    def compose(self, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Run the compose client with `args` in the repository, its output captured."""
        return subprocess.run(
            [*self.engine.compose, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        """Start the compose client with `args`, its output piped."""
        return subprocess.Popen(
            [*self.engine.compose, *args],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def explain(self, proc: subprocess.CompletedProcess[str]) -> str:
        """Why a compose run failed: its exit status, what the coordinator and errors said."""
        lines = (proc.stdout + proc.stderr).splitlines()
        telling = [ln for ln in lines if re.search(r"coordinator|ERROR|Error|Traceback|exit", ln)]
        return f"exit status {proc.returncode}:\n" + "\n".join(telling[-60:])

    def containers(self, *filters: str) -> list[str]:
        """Names of this project's containers (all, or those the `--filter`s select)."""
        project = f"label=com.docker.compose.project={self.name}"
        flags = [f"--filter={f}" for f in (project, *filters)]
        proc = subprocess.run(
            [self.engine.cli, "ps", "-a", *flags, "--format", "{{.Names}}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return proc.stdout.split()

    def container(self, service: str) -> str:
        """The name of the one container of `service` in this project."""
        (name,) = self.containers(f"label=com.docker.compose.service={service}")
        return name

    def exec(self, service: str, *cmd: str) -> subprocess.CompletedProcess[str]:
        """Run `cmd` in the container of `service`, its output captured."""
        return subprocess.run(
            [self.engine.cli, "exec", self.container(service), *cmd],
            capture_output=True,
            text=True,
            timeout=120,
        )

    def copy_out(self, service: str, path: str, dest: Path) -> Path:
        """Copy the file at `path` in the container of `service` to `dest` here."""
        source = f"{self.container(service)}:{path}"
        proc = subprocess.run(
            [self.engine.cli, "cp", source, str(dest)], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        return dest

    def down(self) -> None:
        """Remove every container, volume and network of the project, whatever state it is in."""
        self.compose("--profile", "simulated", "down", "-v", "-t", "2", timeout_s=300)
        left = self.containers()
        if left:
            subprocess.run([self.engine.cli, "rm", "-f", *left], capture_output=True, timeout=120)
        subprocess.run(
            [self.engine.cli, "network", "rm", f"{self.name}_default"],
            capture_output=True,
            timeout=60,
        )
