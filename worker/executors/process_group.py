"""An executor's process as the agent starts, watches and kills it: a process group of its own.

An executor runs users' code, which may start processes of its own (`subprocess.Popen`,
`os.fork`). Those inherit the executor's pipes, so the pipes reaching end-of-file says
nothing about the executor having ended: a grandchild can hold them open for ever. So an
executor starts in a session (and process group) of its own, its end is noticed from the
process itself (the child watcher), not from its pipes, and killing it kills its group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import IO, Any

# How long the frames an executor wrote before it ended may take to be read once it has
# ended; past this the pipe is held by a process that left its group, and is closed.
FRAMES_AFTER_EXIT_S = 1.0


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's protocol for a process with streams, which also says when the process exits.

    asyncio's own `Process.wait()` waits for the pipes to close as well (Python 3.11), so it
    would wait as long as a grandchild holds them.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit, loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


class GroupProcess:
    """A started executor: its streams (`proc`), its exit (`exited`), its group to kill."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        transport: asyncio.SubprocessTransport,
        exited: asyncio.Future[None],
        capture: IO[bytes] | None = None,
    ) -> None:
        """Wrap a process started by `start`."""
        self.proc = proc
        self.transport = transport
        self.exited = exited
        # Its stderr: a file of the agent's, read back after a crash (worker/executor/captured.py).
        self.capture = capture

    @property
    def pid(self) -> int:
        """The executor's pid, which is also its process group's id."""
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """Its exit status once it has exited (negative: the signal that killed it)."""
        return self.proc.returncode

    def kill_group(self) -> None:
        """SIGKILL the executor and every process of its group (those it started, theirs).

        Also once the executor itself has ended: what it started dies with it.
        """
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # nobody is left in the group
        except PermissionError:
            # A group member of another uid (a contained executor is the tenant's; the agent
            # may kill it by its capabilities but not every process it started may be).
            if self.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()

    def close_pipes(self) -> None:
        """Close the agent's ends of the pipes (a writer waiting on a full pipe is woken)."""
        self.transport.close()
        if self.capture is not None:
            self.capture.close()


async def start(
    program: str, *args: str, capture: IO[bytes] | None = None, **kwargs: Any
) -> GroupProcess:
    """Start `program` in a new session, stdin and stdout piped (as create_subprocess_exec).

    Its stderr goes to `capture` (a file), if given.
    """
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _Protocol(2**16, loop),
        program,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        # setsid(): a session and process group of its own, whose id is its pid.
        start_new_session=True,
        stderr=capture,
        **kwargs,
    )
    proc = asyncio.subprocess.Process(transport, protocol, loop)
    return GroupProcess(proc, transport, protocol.exited, capture)


def exit_reason(code: int) -> str:
    """An exit status in words: `exit code 1`, `killed by SIGSEGV`."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
