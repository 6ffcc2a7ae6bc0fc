"""`vramfabric run JOB.toml --detach`: the job's coordinator in a process outliving the terminal.

The coordinator is `vramfabric -v run JOB.toml` started in a session of its own (no
controlling terminal: closing the terminal, or killing the launching shell's process
group, does not reach it), stdin from /dev/null, stdout and stderr appended to a log file.
This command returns once that process drives the job: its heartbeat names the
process's pid (coordinator/jobs/driver.py), after its spec and origin are stored and just
before its run record says `running`, leases and chunks still to come. It returns at once,
too, when the coordinator finished (a job whose chunks all had results) or failed (its exit
code, and its log's last lines).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from vramfabric.broker.connection import connect
from vramfabric.broker.jobdriver import JobDriver
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator.jobs.driver import driven_by, read_driver, read_origin
from vramfabric.coordinator.settings import CoordinatorSettings

from .exits import RET_FAILED, RET_OK
from .report import err

# How long this command waits for the coordinator to start driving the job.
START_WAIT_S = 60.0
# Lines of the log shown when the coordinator exits with an error before it drove the job.
_LOG_TAIL_LINES = 20


def log_dir(environ: Mapping[str, str]) -> Path:
    """Where detached coordinators log: $XDG_STATE_HOME/vramfabric/jobs, else ~/.local/state/."""
    if environ.get("XDG_STATE_HOME"):
        return Path(environ["XDG_STATE_HOME"]) / "vramfabric" / "jobs"
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / ".local" / "state" / "vramfabric" / "jobs"


def detach(args: argparse.Namespace, job_id: str, environ: Mapping[str, str] = os.environ) -> int:
    """Start the job's coordinator detached; print its job id, pid and log; its exit code."""
    log = Path(args.log).resolve() if args.log else log_dir(environ) / f"{job_id}.log"
    running, logged = asyncio.run(_driver(job_id))
    if running is not None:
        _say(args, job_id, running.pid, Path(logged or log), "already_running", driven_by(running))
        return RET_OK
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(log, "ab") as out, open(os.devnull, "rb") as nothing:
        proc = subprocess.Popen(
            _command(args, log),
            stdin=nothing,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # no controlling terminal: its hangup never reaches it
        )
    code = asyncio.run(_started(proc, job_id))
    if code is None:
        _say(args, job_id, proc.pid, log, "running", f"detached: coordinator pid {proc.pid}")
        return RET_OK
    if code == RET_OK:
        _say(args, job_id, proc.pid, log, "finished", "every chunk has its result")
        return RET_OK
    err.print(f"vramfabric run: the detached coordinator exited {code}; its log {log} ends:")
    for line in log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]:
        err.print(f"  {line}", markup=False, highlight=False)
    return code if code > 0 else RET_FAILED  # < 0: killed by a signal


def _command(args: argparse.Namespace, log: Path) -> list[str]:
    """The detached coordinator's command line: this run, in the foreground, logged."""
    command = [sys.executable, "-m", "vramfabric", "-v", "run", str(Path(args.jobfile).resolve())]
    command += ["--logged-to", str(log)]
    if args.timeout_s is not None:
        command += ["--timeout-s", repr(args.timeout_s)]
    if args.retry_failed:
        command.append("--retry-failed")
    if args.no_wait:
        command.append("--no-wait")
    if args.metrics_port is not None:
        command += ["--metrics-port", str(args.metrics_port)]
    if args.plot:
        command += ["--plot", str(Path(args.plot).resolve())]
    return command


async def _driver(job_id: str) -> tuple[JobDriver | None, str]:
    """The process driving the job now, if any, and the log its origin names ("" if none)."""
    broker = BrokerSettings.from_env()
    tenant = CoordinatorSettings.from_env().tenant
    conn = await connect(broker, name="vramfabric-detach")
    try:
        driver = await read_driver(conn, broker, tenant, job_id)
        origin = await read_origin(conn, broker, tenant, job_id) if driver else None
    finally:
        await conn.close()
    return driver, origin.log if origin else ""


async def _started(proc: subprocess.Popen[bytes], job_id: str) -> int | None:
    """None once `proc` drives the job (or still runs at the deadline); else its exit code."""
    broker = BrokerSettings.from_env()
    tenant = CoordinatorSettings.from_env().tenant
    conn = await connect(broker, name="vramfabric-detach")
    try:
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            if (code := proc.poll()) is not None:
                return code
            driver = await read_driver(conn, broker, tenant, job_id)
            if driver is not None and driver.pid == proc.pid:
                return None
            await asyncio.sleep(0.1)  # polling interval, not synchronisation
    finally:
        await conn.close()
    err.print(
        f"vramfabric run: the detached coordinator (pid {proc.pid}) has not started job "
        f"{job_id} after {START_WAIT_S:.0f}s; it keeps trying: see its log"
    )
    return None


def _say(
    args: argparse.Namespace, job_id: str, pid: int, log: Path, state: str, detail: str
) -> None:
    """One line (or one JSON object) saying where the job stands and where it logs."""
    if args.json:
        said = {"job": job_id, "state": state, "pid": pid, "log": str(log)}
        print(json.dumps(said), flush=True)
        return
    print(f"job {job_id} {state.replace('_', ' ')} ({detail})", flush=True)
    print(f"log: {log}", flush=True)
    print(
        f"follow it with `vramfabric job {job_id}`, stop it with `vramfabric cancel {job_id}`, "
        f"or wait for its result with Fabric.job({job_id!r}).result()",
        flush=True,
    )
