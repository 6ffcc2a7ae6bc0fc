"""Processes a chunk leaves running, found and killed inside its executor once no chunk runs.

A chunk's code may start processes (`subprocess.Popen`, `os.fork`) and return while they
run. Nothing of an ended chunk may keep running on its slot, so the executor, a child
subreaper (orphans of what it started are re-parented to it, not to init), kills every
process it started, and theirs, as soon as no chunk runs in it. Finding that there are
none is one system call (`waitid`): the usual chunk pays nothing more. A process that left
the executor's process group and whose parent still runs is found once its parent is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

# prctl(2): make this process the reaper of its orphaned descendants.
_PR_SET_CHILD_SUBREAPER = 36
# Passes of find-and-kill: each kills what the last one orphaned (a grandchild of a child).
_MAX_PASSES = 16
# How long a pass waits for what it killed to end (a process in the kernel's uninterruptible
# sleep ends only when the call returns); one it could not kill (setuid) is left after this.
_REAP_S = 1.0


def become_subreaper() -> None:
    """Have the orphans of this process's descendants re-parented here (Linux only)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class Leftovers:
    """Counts the chunks running in this process and kills their leftovers when none runs."""

    def __init__(self) -> None:
        """No chunk running yet."""
        self._lock = threading.Lock()
        self._running = 0

    def enter(self) -> None:
        """A chunk starts: what it starts from now on is its own until it ends."""
        with self._lock:
            self._running += 1

    def leave(self) -> int:
        """A chunk ended; with no other running, kill what was left. How many were killed."""
        with self._lock:
            self._running -= 1
            # Under the lock: a chunk starting now cannot have started a process yet.
            return kill_leftovers() if self._running == 0 else 0


def kill_leftovers() -> int:
    """SIGKILL and reap every process this one started (and theirs); how many there were."""
    killed: set[int] = set()
    for _ in range(_MAX_PASSES):
        if not _has_children():
            break
        # One already killed is still dying, or could not be killed (another uid's): left.
        found = [pid for pid in _descendants() if pid not in killed]
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed.update(found)
        _reap()
    return len(killed)


def _has_children() -> bool:
    """Whether any child (running or not yet reaped) is there: one system call, reaps none."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _descendants() -> list[int]:
    """This process's children and the members of its process group, itself apart."""
    me, group = os.getpid(), os.getpgid(0)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        # Fields after the command (which may hold spaces and parentheses): state ppid pgrp.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[1]) == me or int(fields[2]) == group:
            found.append(int(name))
    return found


def _reap() -> None:
    """Reap the killed children (none stays a zombie), waiting up to _REAP_S for them."""
    deadline = time.monotonic() + _REAP_S
    while time.monotonic() <= deadline:
        pid = _reaped()
        if pid is None:
            return  # none left
        if pid:
            continue  # one reaped: look for the next at once
        time.sleep(0.001)  # the poll period while the killed ones die


def _reaped() -> int | None:
    """The pid of a child reaped now, 0 while some still run, None when none is left."""
    try:
        return os.waitpid(-1, os.WNOHANG)[0]
    except ChildProcessError:
        return None
