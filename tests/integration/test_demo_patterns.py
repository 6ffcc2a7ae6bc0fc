"""`vramfabric demo --kernel NAME`: a CUDA kernel's pattern end to end on simulated GPUs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "vramfabric"]


@pytest.mark.timeout(180)
def test_demo_montecarlo_runs_the_cuda_source_and_matches_the_reference() -> None:
    # When a user runs the Monte Carlo pattern (its CUDA source on the workers' host path)
    proc = subprocess.run(
        [*CLI, "demo", "--kernel", "montecarlo", "--json"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    # Then it exits 0 with every chunk ok and the estimate equal to the direct reference's
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["kernel"] == "montecarlo" and summary["matches_reference"] is True
    assert summary["ok"] == summary["chunks"] == 200 and summary["failed"] == 0
    assert summary["answer"].startswith("pi ~ 3.14")
    assert summary["leased_bytes_after"] == 0 and summary["worker_exit_codes"] == [0, 0]


@pytest.mark.timeout(180)
def test_the_default_demo_with_auth_runs_hyperparam_cu_without_allow_code() -> None:
    # When a user runs the default search on an auth-on fabric whose tenant has no allow_code
    # (and whose workers run no users' code)
    proc = subprocess.run(
        [*CLI, "demo", "--auth", "--json"], capture_output=True, text=True, timeout=150
    )
    # Then the workers ran hyperparam.cu on their host path and found the reference's best
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["auth"] is True and summary["ran"] == "cuda source on the host path"
    assert summary["ok"] == 1000 and summary["failed"] == 0
    assert summary["best_index"] == 996 and summary["matches_reference"] is True
