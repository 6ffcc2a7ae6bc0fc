"""The lease plot: `vramfabric demo --plot` draws the run's leases and chunks done."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "vramfabric"]


def test_demo_plot_shows_the_lease_ramp_and_the_drop_to_zero(tmp_path: Path) -> None:
    # When a user runs the demo with --plot
    png = tmp_path / "leases.png"
    proc = subprocess.run(
        [*CLI, "demo", "--json", "--plot", str(png)], capture_output=True, text=True, timeout=120
    )
    # Then it succeeds and the series behind the plot rises to 1000 leases, every chunk
    # gets done, and the leases drop to zero at the end
    assert proc.returncode == 0, proc.stderr[-3000:]
    series = json.loads(proc.stdout)["series"]
    times = [p[0] for p in series]
    assert times == sorted(times)
    assert max(p[1] for p in series) >= 1000
    assert series[-1][1] == 0
    assert series[-1][2] == 1000
    assert [p[2] for p in series] == sorted(p[2] for p in series)
    # And the PNG is written
    assert png.stat().st_size > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_to_a_missing_folder_is_refused_before_anything_runs(tmp_path: Path) -> None:
    # Given a job file and no fabric anywhere (a run would fail to connect, exit 3)
    job = tmp_path / "job.toml"
    job.write_text('kernel = "hyperparam_eval"\naggregate = "argmin"\n[inputs]\ngrid = 10\n')
    env = {**os.environ, "VRAMFABRIC_NATS_URL": "nats://127.0.0.1:1", "COLUMNS": "1000"}
    bad = "/nonexistent/dir/x.png"
    for command in (["run", str(job)], ["demo"]):
        # When the user asks for the plot in a folder that does not exist
        proc = subprocess.run(
            [*CLI, *command, "--plot", bad], capture_output=True, text=True, env=env, timeout=60
        )
        # Then the command refuses at once with a usage error naming the path: no job ran,
        # no server was started (demo), no traceback
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert bad in proc.stderr and "does not exist" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stdout == ""
