"""Hosts simulated on one machine: a Linux network namespace each, joined by a bridge.

Every host gets a veth pair: one end in its namespace (`eth0`, an address on SUBNET), the
other on a bridge in a namespace of its own (the switch). Nothing is added to the root
namespace, so runs side by side never see each other, whatever addresses they use. A host
is cut off by setting its switch port down: its processes keep running and its sockets stay
open, but nothing gets through either way, as when a cable is pulled (no RST, no error).

Needs root on Linux and `ip` (iproute2). Namespaces are named `vfmh<pid>-<host>`: those of
a process that died without cleaning up are removed by the next run (`sweep`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from vramfabric.broker.server import die_with_parent

SUBNET = "10.77.0"
_PREFIX = "vfmh"
_CLONE_NEWNET = 0x40000000
_NETNS_DIR = Path("/run/netns")


def _ip(*args: str) -> str:
    """Run `ip ARGS`; its stdout (RuntimeError with its stderr if it fails)."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None if they can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"{_PREFIX}{os.getpid()}-probe{uuid.uuid4().hex[:4]}"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot make a network namespace: {exc}"
    _ip("netns", "del", probe)
    return None


def _pids_in(netns: str) -> list[int]:
    with contextlib.suppress(RuntimeError):
        return [int(p) for p in _ip("netns", "pids", netns).split()]
    return []


def _delete(netns: str) -> None:
    """Kill whatever still runs in `netns` (only this module's runs start processes there)."""
    for pid in _pids_in(netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(RuntimeError):
        _ip("netns", "del", netns)


def sweep() -> None:
    """Remove the namespaces of runs whose process is gone (one killed before its cleanup)."""
    if not _NETNS_DIR.is_dir():
        return
    for entry in _NETNS_DIR.iterdir():
        match = re.match(rf"^{_PREFIX}(\d+)-", entry.name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            _delete(entry.name)


def _enter(netns: str) -> None:
    """preexec_fn: move the child into `netns` and tie it to its parent's life."""
    fd = os.open(str(_NETNS_DIR / netns), os.O_RDONLY)
    try:
        if ctypes.CDLL("libc.so.6", use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
    finally:
        os.close(fd)
    die_with_parent()


@attrs.frozen
class Host:
    """One simulated host: its namespace, its address, and its port on the switch."""

    name: str
    netns: str
    address: str
    switch_port: str


@attrs.define
class Network:
    """Hosts on one bridge. `create` them, `popen` processes on them, `cut` and `restore`.

    Start processes from a thread that outlives them (the main thread): they die with it.
    """

    tag: str = attrs.field(factory=lambda: f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:4]}")
    hosts: dict[str, Host] = attrs.field(factory=dict)
    procs: list[subprocess.Popen[bytes]] = attrs.field(factory=list)

    @property
    def switch(self) -> str:
        """The namespace that holds the bridge."""
        return f"{self.tag}-sw"

    def create(self, names: Sequence[str]) -> Network:
        """Make the switch and one host per name, addressed SUBNET.1, .2, ... in order."""
        sweep()
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "dev", "br0", "up")
        for i, name in enumerate(names, start=1):
            host = Host(name, f"{self.tag}-{name}", f"{SUBNET}.{i}", f"p{i}")
            self.hosts[name] = host
            _ip("netns", "add", host.netns)
            self._wire(host)
        return self

    def _wire(self, host: Host) -> None:
        # Both ends are made in their namespaces: the root namespace never holds either.
        _ip(
            "link",
            "add",
            "eth0",
            "netns",
            host.netns,
            "type",
            "veth",
            "peer",
            "name",
            host.switch_port,
            "netns",
            self.switch,
        )
        _ip("-n", self.switch, "link", "set", "dev", host.switch_port, "master", "br0")
        _ip("-n", self.switch, "link", "set", "dev", host.switch_port, "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "dev", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "dev", "lo", "up")

    def popen(
        self,
        host: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        cwd: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `argv` on `host`, its output to `log_path`; kept for `destroy`."""
        netns = self.hosts[host].netns
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda: _enter(netns),
            )
        self.procs.append(proc)
        return proc

    def cut(self, host: str) -> None:
        """Pull `host`'s cable: its switch port down."""
        _ip("-n", self.switch, "link", "set", "dev", self.hosts[host].switch_port, "down")

    def restore(self, host: str) -> None:
        """Plug `host` back in."""
        _ip("-n", self.switch, "link", "set", "dev", self.hosts[host].switch_port, "up")

    def destroy(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every process started here, SIGKILL what outlives `timeout_s`, delete all."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # Their children (nats-server, executors) die with them; any left are killed here.
        for host in self.hosts.values():
            _delete(host.netns)
        _delete(self.switch)
        self.procs.clear()
