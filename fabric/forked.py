"""ForkedWorker: a worker process forked from this one, which has imported the agent already.

`vramfabric up` starts its workers this way: each spawned worker spent 0.35 s importing the
same modules again, two at once on 2 cores, after `up`'s own start (docs/BENCHMARKS.md,
Ready). A fork shares the imports it finds, so a forked worker serves about 0.15 s sooner.

Only a process with no thread, no event loop and no secret may fork workers: a child gets a
copy of everything its parent holds. It is then exactly the worker that `python -m
vramfabric.worker ARGV` would be (the same flags, the same environment), and it answers
what `LocalFleet` asks of a `subprocess.Popen` (poll, wait, signals, its stdout).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from typing import IO, NoReturn

from vramfabric.broker.server import die_with_parent


class ForkedWorker:
    """One forked worker; its stdout (the ready line) is a pipe to this process."""

    def __init__(self, pid: int, stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdout: IO[bytes] | None = stdout
        self.returncode: int | None = None
        # A pidfd names this process and no later one with its pid: signals never go astray.
        self._pidfd = os.pidfd_open(pid)

    @classmethod
    def start(cls, argv: Sequence[str], env: Mapping[str, str], quiet: bool) -> ForkedWorker:
        """Fork a worker run with `argv` (its flags) in `env`; stderr to /dev/null if `quiet`."""
        if threading.active_count() > 1:
            # A lock another thread held at the fork stays held in the child for ever.
            raise RuntimeError("workers are forked only from a process with one thread")
        # What this process has buffered would otherwise be written twice, once by the child.
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _child(list(argv), dict(env), quiet, write_end)
        os.close(write_end)
        return cls(pid, os.fdopen(read_end, "rb"))

    def poll(self) -> int | None:
        """The exit code once the process has exited, else None (as Popen.poll)."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._exited(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code; subprocess.TimeoutExpired after `timeout` s (as Popen.wait)."""
        if self.returncode is None:
            readable, _, _ = select.select([self._pidfd], [], [], timeout)
            if not readable:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
            self._exited(os.waitpid(self.pid, 0)[1])
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send `sig` unless the process has been reaped (as Popen.send_signal)."""
        if self.returncode is None:
            signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.send_signal(signal.SIGKILL)

    def _exited(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)
        os.close(self._pidfd)


def _child(argv: list[str], env: dict[str, str], quiet: bool, stdout_fd: int) -> NoReturn:
    """In the forked process: become the worker, then exit without this copy's cleanups."""
    code = 1
    try:
        os.dup2(stdout_fd, 1)
        os.close(stdout_fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        if quiet:
            os.dup2(devnull, 2)
        os.close(devnull)
        die_with_parent()
        os.environ.clear()
        os.environ.update(env)
        from vramfabric.worker.__main__ import main

        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors: their code, as a process would exit
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # recorded: the traceback on stderr and exit code 1
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            # Not sys.exit: the parent's atexit work (its temp dirs, its server) is not ours.
            os._exit(code)
