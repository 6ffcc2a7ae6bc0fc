"""Test helpers: poll with a deadline instead of sleeping, and small factories."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import IO


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
) -> None:
    """Poll `predicate` until it is true; fail the test with AssertionError at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)  # polling interval, not synchronisation


def wait_for_line(stream: IO[str] | IO[bytes] | None, needle: str, timeout_s: float = 20.0) -> str:
    """Read a subprocess pipe until a line contains `needle`; AssertionError at the deadline."""
    import select

    assert stream is not None, "start the process with this stream piped"
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.1)
        if ready:
            line = stream.readline()
            if not line:
                break
            text = line.decode(errors="replace") if isinstance(line, bytes) else line
            seen.append(text)
            if needle in text:
                return text
    raise AssertionError(f"{needle!r} not seen within {timeout_s}s; got: {''.join(seen)[-2000:]}")


def poll_until(
    predicate: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.05
) -> bool:
    """Synchronous `eventually`: poll `predicate` until true; False at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)  # polling interval, not synchronisation
    return True


def interrupt(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> int:
    """Ctrl-C a command started with piped stdout and stderr; its exit code (pipes closed)."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(30)
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def alive(pid: int) -> bool:
    """Whether a process exists (and is not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                continue
    return out


def survivors_of_kill(proc: subprocess.Popen[bytes], kids: list[int]) -> list[int]:
    """Kill `proc` -9 (no cleanup code of its own runs); the `kids` still alive after 30 s."""
    proc.kill()
    proc.wait(10)
    poll_until(lambda: not any(alive(k) for k in kids), timeout_s=30)
    return [k for k in kids if alive(k)]


def kill_and_close(proc: subprocess.Popen[bytes]) -> None:
    """Make sure a piped command is gone, and close its pipes."""
    proc.kill()
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def has_ipv6_loopback() -> bool:
    """Whether this machine can listen on ::1 (tests of IPv6 addresses skip without it)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True
