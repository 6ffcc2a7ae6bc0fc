"""Ctrl-C typed at a real terminal during `vramfabric run`: one line, exit 130, no traceback.

The command runs on a pseudo-terminal as its controlling terminal (its progress display
then draws as on a user's screen); the test types ^C into the terminal, so the kernel's
line discipline sends SIGINT to the command's process group, as a user's keyboard does.
"""

from __future__ import annotations

import os
import pty
import select
import sys
import time
from pathlib import Path

from vramfabric.broker import BrokerSettings

CTRL_C = b"\x03"


def read_until(fd: int, text: str, timeout_s: float) -> str:
    """What the terminal showed, read until `text` appears (or the timeout, or EOF)."""
    seen = b""
    deadline = time.monotonic() + timeout_s
    while text.encode() not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the command exited and the terminal closed
            break
        if not chunk:
            break
        seen += chunk
    return seen.decode(errors="replace")


def test_ctrl_c_at_a_terminal_during_run_says_how_to_resume(
    tmp_path: Path, broker: BrokerSettings
) -> None:
    # Given `vramfabric run` of a job on a terminal, waiting for a node to advertise
    job = tmp_path / "job.toml"
    job.write_text('kernel = "hyperparam_eval"\naggregate = "argmin"\n[inputs]\ngrid = 10\n')
    env = dict(
        os.environ,
        VRAMFABRIC_NATS_URL=broker.url,
        VRAMFABRIC_PREFIX=broker.prefix,
        TERM="xterm",
        COLUMNS="120",
    )
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal is its controlling terminal
        os.execve(sys.executable, [sys.executable, "-m", "vramfabric", "run", str(job)], env)
    try:
        shown = read_until(fd, "no node is advertising", timeout_s=60)
        assert "no node is advertising" in shown
        # When the user types Ctrl-C
        os.write(fd, CTRL_C)
        rest = read_until(fd, "to resume it", timeout_s=30)
        rest += read_until(fd, "\0never", timeout_s=5)  # whatever else, until it exits
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    # Then it exits 130, with one line saying where the job stands and how to resume it
    assert os.waitstatus_to_exitcode(status) == 130
    assert "Traceback" not in shown + rest
    said = [line for line in rest.splitlines() if "interrupted" in line]
    assert len(said) == 1 and "vramfabric run: interrupted: job " in said[0]
    assert "0/10 chunks done" in rest and "run the same command again to resume it" in rest
