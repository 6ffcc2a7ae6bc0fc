"""Issue 14: what an operator sees at the CLI's edges: one line, the documented exit code.

Each test runs `vramfabric` as a subprocess and asserts its stderr lines and exit code, and
that no traceback reaches the user.
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import wait_for_line
from vramfabric.broker import BrokerSettings

CLI = [sys.executable, "-m", "vramfabric"]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "COLUMNS": "80", **extra}  # 80: as rich assumes for a pipe


def _job(tmp_path: Path, grid: int = 10) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f'kernel = "hyperparam_eval"\naggregate = "argmin"\n[inputs]\ngrid = {grid}\n')
    return path


@pytest.fixture
def http_url() -> Iterator[str]:
    """An HTTP server on a free port: something that answers, but not NATS."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"nats://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "url, says",
    [
        ("nats://127.0.0.1:4222:99", "the port in '127.0.0.1:4222:99' is not a number"),
        ("http://127.0.0.1:8222", "scheme http:// is not one of nats, tls, ws, wss"),
        ("garbage", "no scheme and no port"),
    ],
)
def test_a_url_that_does_not_parse_is_one_line_at_once(url: str, says: str) -> None:
    # Given a URL nats-py cannot use (an AssertionError, or a 3 s timeout, before)
    # When status connects with it
    proc = subprocess.run(
        [*CLI, "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(VRAMFABRIC_NATS_URL=url),
    )
    # Then one line names the variable and the problem; exit 1 (an error), no traceback
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"vramfabric: VRAMFABRIC_NATS_URL: '{url}'")
    assert says in lines[0]


def test_an_http_server_is_named_as_not_nats(http_url: str) -> None:
    # Given a URL where an HTTP server listens
    proc = subprocess.run(
        [*CLI, "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(VRAMFABRIC_NATS_URL=http_url),
    )
    # Then exit 3 with one line saying what answers there, not "request timed out"
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"vramfabric: cannot reach NATS at {http_url}: an HTTP server answers there, not NATS "
        "(NATS clients use port 4222 by default; 8222 is a NATS server's HTTP monitoring port)"
    ]


def test_a_grid_past_the_search_space_exits_2_before_connecting(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*CLI, "run", str(_job(tmp_path, 3000))],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(VRAMFABRIC_NATS_URL="nats://127.0.0.1:1"),  # never reached
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        "vramfabric run: inputs.grid must be an integer from 1 to 1000 (hyperparam_eval's "
        "search space has 1000 configurations), got 3000"
    ]


@pytest.mark.parametrize(
    "command, code",
    [(["up", "--workers", "1"], 1), (["worker"], 2)],
    ids=["up", "worker"],
)
@pytest.mark.parametrize(
    "flags, says",
    [
        (
            ["--simulate", "1x4GiB", "--slice", "7GiB"],
            "a slice of 7GiB is larger than every GPU here (the largest has 4GiB): this node "
            "could lease nothing; give a smaller --slice",
        ),
        (
            ["--simulate", "bogus"],
            "not a simulate spec: 'bogus' (expected COUNTxSIZE, e.g. 4x48GiB)",
        ),
    ],
    ids=["slice-larger-than-gpus", "bad-simulate"],
)
def test_gpus_that_hold_no_slice_are_refused_before_anything_starts(
    tmp_path: Path, command: list[str], code: int, flags: list[str], says: str
) -> None:
    # Given no server at the URL (a worker that started would wait for one)
    env = _env(VRAMFABRIC_NATS_URL="nats://127.0.0.1:1", XDG_RUNTIME_DIR=str(tmp_path))
    # When `up` or a worker is started with GPUs that cannot hold one slice, or no GPUs
    proc = subprocess.run(
        [*CLI, *command, *flags], capture_output=True, text=True, timeout=60, env=env
    )
    # Then it refuses at once with one line that says why, and leaves nothing running
    assert proc.returncode == code, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [f"vramfabric{' worker' * (code == 2)}: {says}"]
    assert not (tmp_path / "vramfabric" / "fabric.json").exists()


def test_a_closed_pipe_ends_quietly() -> None:
    # Given a command whose output is far longer than its reader wants (`jobs | head -1`)
    code = (
        "import sys; from vramfabric import cli, fleet_commands\n"
        "fleet_commands.cmd_jobs = lambda a: [print('job ' * 20) for _ in range(200000)] and 0\n"
        "sys.exit(cli.main(['jobs']))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    # When the reader takes one line and goes away
    proc.stdout.readline()
    proc.stdout.close()
    # Then the command stops with 141 (as SIGPIPE would), nothing on stderr
    assert proc.wait(60) == 141
    assert proc.stderr.read() == b""
    proc.stderr.close()


def test_run_with_no_node_says_so_and_ctrl_c_says_how_to_resume(
    tmp_path: Path, broker: BrokerSettings
) -> None:
    # Given a fabric (a server and prefix) where no worker runs
    env = _env(VRAMFABRIC_NATS_URL=broker.url, VRAMFABRIC_PREFIX=broker.prefix)
    proc = subprocess.Popen(
        [*CLI, "run", str(_job(tmp_path))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    # When it has waited a few seconds
    line = wait_for_line(proc.stderr, "no node is advertising", timeout_s=60)
    # Then one line says what it waits for and how to start workers
    assert f"on {broker.url} (prefix {broker.prefix}) after 5s" in line
    assert "vramfabric worker --simulate" in line and "waiting for one" in line
    # And Ctrl-C then says where the job stands and how to resume it, exit 130
    assert proc.stderr is not None and proc.stdout is not None
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(30) == 130
    proc.stdout.close()
    proc.stderr.close()
    lines = rest.strip().splitlines()
    assert "Traceback" not in rest
    assert len(lines) == 1 and lines[0].startswith("vramfabric run: interrupted: job ")
    assert "has 0/10 chunks done (0 failed)" in lines[0]
    assert "run the same command again to resume it" in lines[0]


def test_run_no_wait_exits_7_with_no_node(tmp_path: Path, broker: BrokerSettings) -> None:
    env = _env(VRAMFABRIC_NATS_URL=broker.url, VRAMFABRIC_PREFIX=broker.prefix)
    proc = subprocess.run(
        [*CLI, "run", str(_job(tmp_path)), "--no-wait", "--json"],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert proc.returncode == 7, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no node is advertising" in lines[0]
    assert lines[0].endswith("then run the same command again (--no-wait: not waiting)")
    assert proc.stdout == ""
