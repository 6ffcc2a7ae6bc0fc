"""compose.yaml brings up the cluster, workers and a coordinator job (needs a Docker engine)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import docker_available

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.skipif(
    not docker_available() or shutil.which("docker") is None, reason="no Docker engine"
)
def test_compose_runs_the_search_on_the_cluster() -> None:
    # When the compose file's coordinator runs to completion
    try:
        proc = subprocess.run(
            [
                "docker",
                "compose",
                "up",
                "--abort-on-container-exit",
                "--exit-code-from",
                "coordinator",
                "coordinator",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        # Then it found the best of 1000 configurations with no failed chunk
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = [x for x in proc.stdout.splitlines() if '"job_id"' in x][-1]
        report = json.loads(line.split("|", 1)[-1].strip())
        assert report["ok"] == 1000 and report["failed"] == 0
    finally:
        subprocess.run(
            ["docker", "compose", "down", "-v"], cwd=ROOT, capture_output=True, timeout=300
        )
