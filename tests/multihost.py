"""A fabric across hosts: 3 servers, 4 workers and a coordinator, each on a host of its own.

The hosts are network namespaces on one bridge (tests/netns.py). Each server is one
`vramfabric server --host ADDR --routes ...` with TLS for clients and routes (a certificate
per host's address, tests/tls_certs.py); workers and the coordinator verify them with the
CA and make R3 streams. While a job of short chunks runs (tests/multihost_job.py), one
worker's host and then one server's host are cut off and brought back. Shared by
tests/integration/test_multihost.py and bench/multihost.py; `account` says what is measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from tests.multihost_job import executions
from tests.multihost_outcome import SLICES, Cut, Outcome, account, as_json
from tests.netns import Network
from tests.tls_certs import Certs, make_certs

REPO = str(Path(__file__).resolve().parents[1])
SERVERS = ("s1", "s2", "s3")
WORKERS = ("w1", "w2", "w3", "w4")
COORDINATOR = "c1"
CLIENT_PORT, ROUTE_PORT = 4222, 6222
# The job: N chunks of SLEEP_S each on SLICES leases (two a worker), one chunk a message.
N, SLEEP_S = 3000, 0.04
# How long each host stays cut off: past the node TTL (2 s) and the ack wait (2 s) for a
# worker; past a Raft election (4-9 s, docs/BENCHMARKS.md) for a server.
WORKER_CUT_S, SERVER_CUT_S = 5.0, 8.0
# When each cut begins: the share of chunks executed, and the least time since the last one.
WORKER_CUT_AT, SERVER_CUT_AT, SETTLE_S = 0.15, 0.45, 3.0
READY_S, JOB_S = 120.0, 170.0


def _wait_for(path: Path, needle: str, timeout_s: float, alive: Callable[[], bool]) -> str:
    """Poll a process's log until a line holds `needle`; that line (AssertionError if not)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        found = [line for line in text.splitlines() if needle in line]
        if found:
            return found[0]
        if not alive():
            raise AssertionError(f"{path.name} exited before {needle!r}: {text[-3000:]}")
        time.sleep(0.05)  # polling a file: there is nothing to await
    raise AssertionError(f"{needle!r} not in {path.name} within {timeout_s}s")


def _running(proc: subprocess.Popen[bytes]) -> Callable[[], bool]:
    return lambda: proc.poll() is None


@attrs.define
class MultiHost:
    """The hosts, certificates and processes of one run, under `folder`."""

    folder: Path
    net: Network = attrs.field(factory=Network)
    coordinator: subprocess.Popen[bytes] | None = None
    coordinator_server: str = ""
    certs: Certs | None = None
    # More worker flags (`-v` logs each connect and reconnect, for a look at a run).
    worker_args: tuple[str, ...] = ()

    @property
    def logs(self) -> Path:
        """Where each process's output goes (`<host>.log`)."""
        return self.folder / "logs"

    @property
    def exec_log(self) -> Path:
        """The kernel's execution log (a file per execution)."""
        return self.folder / "executions"

    def address(self, host: str) -> str:
        """A host's address on the bridge."""
        return self.net.hosts[host].address

    @property
    def url(self) -> str:
        """Every server's client URL, as clients take them."""
        return ",".join(f"tls://{self.address(s)}:{CLIENT_PORT}" for s in SERVERS)

    def start(self) -> None:
        """Make the hosts and certificates, start one server a host, wait until each listens."""
        self.logs.mkdir(parents=True)
        self.exec_log.mkdir()
        self.net.create([*SERVERS, *WORKERS, COORDINATOR])
        self.certs = certs = make_certs(self.folder / "tls", {s: self.address(s) for s in SERVERS})
        routes = ",".join(f"nats-route://{self.address(s)}:{ROUTE_PORT}" for s in SERVERS)
        procs = {}
        for s in SERVERS:
            cert, key = certs.servers[s]
            argv = ["--host", self.address(s), "--port", str(CLIENT_PORT), "--routes", routes]
            argv += ["--cluster-port", str(ROUTE_PORT), "--store", str(self.folder / "store" / s)]
            argv += ["--tls-cert", cert, "--tls-key", key, "--tls-ca", certs.ca]
            procs[s] = self._popen(s, ["-m", "vramfabric", "server", *argv])
        for s, proc in procs.items():
            _wait_for(self.logs / f"{s}.log", "nats-server ready", READY_S, _running(proc))

    def _popen(self, host: str, args: list[str]) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMFABRIC_")}
        env |= {
            "VRAMFABRIC_NATS_URL": self.url,
            "VRAMFABRIC_TLS_CA": self.certs.ca if self.certs else "",
            "VRAMFABRIC_PREFIX": "mh",
            "VRAMFABRIC_REPLICAS": "3",
            "VRAMFABRIC_NODE_TTL_S": "2",
        }
        log = self.logs / f"{host}.log"
        return self.net.popen(host, [sys.executable, *args], env, log, REPO)

    def route_greetings(self) -> dict[str, dict[str, str]]:
        """What each server's route listener answers a stranger and a peer, asked from c1."""
        assert self.certs is not None
        cert, key = self.certs.servers[SERVERS[0]]
        out = self.folder / "greetings.json"
        argv = [str(out), str(ROUTE_PORT), self.certs.ca, cert, key]
        proc = self._popen(COORDINATOR, ["-m", "tests.tls_certs", *argv, *self.addresses])
        proc.wait(READY_S)
        return dict(json.loads(out.read_text()))

    @property
    def addresses(self) -> list[str]:
        """The servers' addresses."""
        return [self.address(s) for s in SERVERS]

    def start_job(self, n: int) -> float:
        """Start the workers and the coordinator's job; when its job began (monotonic)."""
        workers = {}
        for w in WORKERS:
            argv = ["--simulate", "1x8GiB", "--slice", "256MiB", "--node", w, "--heartbeat-s"]
            argv += ["0.5", "--kernel-module", "tests.multihost_job", *self.worker_args]
            workers[w] = self._popen(w, ["-m", "vramfabric.worker", *argv])
        job = [str(n), str(self.exec_log), str(self.folder / "job.json"), str(len(WORKERS))]
        job += [str(SLICES), str(SLEEP_S)]
        self.coordinator = self._popen(COORDINATOR, ["-m", "tests.multihost_job", *job])
        for w, proc in workers.items():
            _wait_for(self.logs / f"{w}.log", "worker ready", READY_S, _running(proc))
        started = _wait_for(
            self.logs / f"{COORDINATOR}.log", "job started", READY_S, _running(self.coordinator)
        )
        fields = dict(word.split("=", 1) for word in started.split() if "=" in word)
        self.coordinator_server = fields["server"]
        return float(fields["at"])

    def executed(self) -> int:
        """Executions so far, of all chunks."""
        return len(os.listdir(self.exec_log))

    def wait_executed(self, at_least: int, not_before: float = 0.0) -> None:
        """Poll until `at_least` executions and the time `not_before`.

        AssertionError if the job ends first, or at the deadline.
        """
        assert self.coordinator is not None
        deadline = time.monotonic() + JOB_S
        while self.executed() < at_least or time.monotonic() < not_before:
            if self.coordinator.poll() is not None:
                raise AssertionError(f"the job ended before {at_least} executions: too short")
            if time.monotonic() > deadline:
                raise AssertionError(f"{at_least} executions not reached within {JOB_S}s")
            time.sleep(0.02)  # polling a folder: there is nothing to await

    def cut(self, kind: str, host: str, down_s: float) -> Cut:
        """Cut `host` off for `down_s`, then bring it back."""
        self.net.cut(host)
        at, executed = time.monotonic(), self.executed()
        time.sleep(down_s)  # the fault itself: a host unreachable this long
        self.net.restore(host)
        return Cut(kind, host, at, time.monotonic(), executed)

    def server_host(self, url: str) -> str:
        """The server host whose client URL this is."""
        return next(s for s in SERVERS if f"//{self.address(s)}:" in url)

    def netns_hosts(self) -> dict[int, str]:
        """Host names by their network namespace's inode (as the execution log names them)."""
        return {os.stat(f"/run/netns/{h.netns}").st_ino: h.name for h in self.net.hosts.values()}

    def stop(self) -> None:
        """Stop every process and remove the hosts."""
        self.net.destroy()


def run(mh: MultiHost, n: int = N, server_cut: str = "coordinator") -> Outcome:
    """Run the job on started hosts, cutting w1 and then a server; reports, never raises.

    `server_cut`: "coordinator" cuts the server the coordinator is connected to, "other"
    one it is not.
    """
    outcome = Outcome(chunks=n)
    cuts: list[Cut] = []
    try:
        began = mh.start_job(n)
        outcome.coordinator_server = mh.coordinator_server
        mh.wait_executed(int(WORKER_CUT_AT * n))
        cuts.append(mh.cut("worker", "w1", WORKER_CUT_S))
        mh.wait_executed(int(SERVER_CUT_AT * n), not_before=cuts[-1].back + SETTLE_S)
        own = mh.server_host(mh.coordinator_server)
        victim = own if server_cut == "coordinator" else next(s for s in SERVERS if s != own)
        if mh.coordinator is not None and mh.coordinator.poll() is not None:
            raise AssertionError("the job ended before the server cut: too short")
        cuts.append(mh.cut("server", victim, SERVER_CUT_S))
        assert mh.coordinator is not None
        mh.coordinator.wait(JOB_S)
        report = json.loads((mh.folder / "job.json").read_text())
        account(outcome, report, executions(str(mh.exec_log)), cuts, began, mh.netns_hosts())
        # Kept beside the logs: what a failed run measured, for a look afterwards.
        (mh.folder / "outcome.json").write_text(json.dumps(as_json(outcome)))
    except (AssertionError, OSError, subprocess.TimeoutExpired, ValueError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    return outcome
