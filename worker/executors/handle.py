"""ExecutorProcess: one executor process as the agent sees it, and the chunks it runs.

It starts `python -m vramfabric.worker.executor` for one GPU, writes frames to its stdin,
reads frames from its stdout, resolves each running chunk's future from them, stores the
checkpoints the chunks send, and fails every chunk still running when the process ends,
whatever ended it (what each learns: outcomes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import attrs

from vramfabric.broker.errors import ExecutorCrashed, VramfabricError

from ..executor import ipc
from ..executor.captured import attach, read_tail
from ..node.gpus import GpuSpec
from .containment import Sandbox
from .layout import ExecKey
from .outcomes import Bystander, Running, failure, judged
from .process_group import FRAMES_AFTER_EXIT_S, GroupProcess, exit_reason
from .start import start_executor

log = logging.getLogger(__name__)

# A frame larger than this is written at once and its writer waits for the pipe to drain.
_DRAIN_ABOVE_BYTES = 64 * 2**10
# How long a killed executor may take to exit before the slot its work held is let go anyway
# (SIGKILL ends a process at once unless it is stuck in the kernel, e.g. on a device).
STOP_WAIT_S = 5.0


@attrs.define(eq=False)
class ExecutorProcess:
    """One executor process and the chunks it is running."""

    key: ExecKey
    # The process, in a process group of its own (worker/executors/process_group.py).
    proc: GroupProcess
    on_exit: Callable[[ExecutorProcess], None]
    ready: asyncio.Future[None] = attrs.field(
        factory=lambda: asyncio.get_running_loop().create_future()
    )
    tasks: dict[int, Running] = attrs.field(factory=dict)
    loaded: set[str] = attrs.field(factory=set)
    # Leases whose chunks ran here and that it has not been told have ended.
    leases: set[str] = attrs.field(factory=set)
    idle_since: float = attrs.field(factory=time.monotonic)
    # Why the process is being killed, for the chunks it takes with it.
    doom: str = ""
    # A chunk said it poisoned the process (a CUDA error): the others are bystanders.
    culprit_known: bool = False
    reader: asyncio.Task[None] | None = None
    # Checkpoints being stored: the loop keeps only weak references to tasks, and a task
    # collected mid-flight would leave its chunk waiting for an answer that never comes.
    _storing: set[asyncio.Task[None]] = attrs.field(factory=set)
    # Frames not yet written: those sent in one turn of the loop go out in one write.
    _outbox: list[bytes] = attrs.field(factory=list)

    @classmethod
    async def spawn(
        cls,
        key: ExecKey,
        gpu: GpuSpec,
        kernel_modules: tuple[str, ...],
        on_exit: Callable[[ExecutorProcess], None],
        slots: int = 1,
        sandbox: Sandbox | None = None,
    ) -> ExecutorProcess:
        """Start the process for `gpu`, to run up to `slots` chunks at once (not waiting).

        With a `sandbox` the process runs as its uid and gid, with no supplementary groups,
        in its private directory.
        """
        proc = await start_executor(gpu, kernel_modules, slots, sandbox)
        exe = cls(key, proc, on_exit)
        exe.reader = asyncio.get_running_loop().create_task(exe._watch())
        return exe

    @property
    def alive(self) -> bool:
        """Whether the process has not exited (nor been told to)."""
        return self.proc.returncode is None and not self.doom

    async def send(self, frame: ipc.Frame) -> None:
        """Queue one frame for the next write; ExecutorCrashed if the process is gone.

        Frames sent in one turn of the event loop (a burst of chunks) go out in one write,
        not one system call each. A frame lost with the process fails its chunk through the
        reader (`_died`), as any chunk running there does.
        """
        stdin = self.proc.proc.stdin
        assert stdin is not None
        if stdin.is_closing():
            raise ExecutorCrashed("executor process gone: its pipe is closed")
        data = self.post(frame)
        if len(data) > _DRAIN_ABOVE_BYTES:
            # A large input or blob: write it now and wait while the pipe is full.
            self._flush()
            try:
                await stdin.drain()
            except (ConnectionError, RuntimeError) as exc:
                raise ExecutorCrashed(f"executor process gone: {exc}") from None

    def post(self, frame: ipc.Frame) -> bytes:
        """Queue one frame for the next write without waiting; return its bytes."""
        data = ipc.encode(frame)
        self._outbox.append(data)
        if len(self._outbox) == 1:
            asyncio.get_running_loop().call_soon(self._flush)
        return data

    def _flush(self) -> None:
        if not self._outbox:
            return
        data = b"".join(self._outbox)
        self._outbox.clear()
        stdin = self.proc.proc.stdin
        assert stdin is not None
        # Best effort: if the process is gone its reader fails the chunks these frames carried.
        with contextlib.suppress(ConnectionError, RuntimeError):
            stdin.write(data)

    def kill(self, why: str) -> None:
        """SIGKILL the process and its group; its running chunks fail with `why`."""
        if not self.doom:
            self.doom = why
        if self.proc.returncode is None:
            self.proc.kill_group()

    async def stop(self, why: str) -> None:
        """Kill the process and its group, and wait (at most STOP_WAIT_S) until it exited."""
        self.kill(why)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.proc.exited), STOP_WAIT_S)

    async def _watch(self) -> None:
        """Read frames until the process ends, then fail what it was running.

        Its end is the process's own, never its pipe's end-of-file: a process a chunk
        started may hold the pipe open for ever. Whatever it started dies with it.
        """
        frames = asyncio.get_running_loop().create_task(self._read())
        try:
            await self._until_ended(frames)
            self._died()
        finally:
            frames.cancel()
            if self.proc.returncode is None:  # the watch itself was cancelled: no orphans
                self.proc.kill_group()
            self.proc.close_pipes()

    async def _until_ended(self, frames: asyncio.Task[None]) -> None:
        """Wait for the process to end (killing it if its frames end first), then its group."""
        await asyncio.wait((frames, self.proc.exited), return_when=asyncio.FIRST_COMPLETED)
        if not self.proc.exited.done() and not self.doom:
            # Its pipe closed: it is ending (crashed, or done), or it closed the pipe itself.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.proc.exited), FRAMES_AFTER_EXIT_S)
        if not self.proc.exited.done():
            # No more frames (a bad one, or its pipe closed) from a live process: useless.
            self.kill(self.doom or "executor closed its frame pipe")
            await self.proc.exited
        self.proc.kill_group()
        # The frames it wrote before it ended (a `done` naming the culprit) are read first.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(frames), FRAMES_AFTER_EXIT_S)

    async def _read(self) -> None:
        stdout = self.proc.proc.stdout
        assert stdout is not None
        try:
            while True:
                header = await stdout.readexactly(ipc.HEADER_BYTES)
                self._on_frame(ipc.decode(await stdout.readexactly(ipc.length_of(header))))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the pipe is closed: the process is gone, or going (`_watch`)
        except (ValueError, TypeError, KeyError) as exc:
            # A garbled frame (users' code runs there): the process cannot be trusted now.
            self.kill(f"executor sent a bad frame: {type(exc).__name__}: {exc}")

    def _on_frame(self, frame: ipc.Frame) -> None:
        if isinstance(frame, ipc.Ready):
            if not self.ready.done():
                self.ready.set_result(None)
            return
        if not isinstance(frame, ipc.Done | ipc.Checkpoint):
            return  # an agent's frame: never sent this way
        task = self.tasks.get(frame.task)
        if task is None:
            return  # a chunk that already failed (its deadline passed)
        if isinstance(frame, ipc.Done):
            if task.future.done():
                return
            if frame.ok:
                task.cost_s = float(frame.cost_s)
                task.future.set_result(bytes(frame.output))
            else:
                error = failure(frame)
                attach(error, str(frame.printed), str(frame.traceback))
                self.culprit_known |= isinstance(error, ExecutorCrashed)
                task.future.set_exception(error)
        else:
            # Stored off the read loop: the executor may finish other chunks meanwhile.
            stored = asyncio.get_running_loop().create_task(self._checkpoint(frame, task))
            self._storing.add(stored)
            stored.add_done_callback(self._storing.discard)

    async def _checkpoint(self, frame: ipc.Checkpoint, task: Running) -> None:
        error: str | None = None
        try:
            state = bytes(frame.state)
            if task.save is None:
                raise ValueError("this chunk cannot checkpoint")
            if len(state) > ipc.MAX_CHECKPOINT_BYTES:
                raise ValueError(f"checkpoint of {len(state)} bytes is over the limit")
            await task.save(state)
        except (VramfabricError, ValueError, TypeError, KeyError) as exc:
            error = str(exc)
        with contextlib.suppress(ExecutorCrashed):
            await self.send(ipc.Checkpointed(task=frame.task, error=error))

    def _died(self) -> None:
        code = self.proc.returncode
        assert code is not None  # it has exited (`_watch`)
        why = self.doom or f"executor process died ({exit_reason(code)}) while running this chunk"
        running = [task for task in self.tasks.values() if not task.future.done()]
        for task in running:
            verdict = judged(why, len(running), self.culprit_known, self.doom)
            # A bystander runs again; the others keep what the process printed last.
            task.future.set_exception(
                verdict if isinstance(verdict, Bystander) else self.tailed(verdict)
            )
        if not self.ready.done():
            self.ready.set_exception(ExecutorCrashed(why))
            self.ready.exception()  # retrieved: the starter reports it
        self.on_exit(self)
        quiet = self.doom.startswith(("idle", "executor killed: the node"))
        level = logging.INFO if quiet else logging.WARNING
        log.log(level, "executor ended key=%s pid=%d %s", self.key, self.proc.pid, why)

    def tailed(self, exc: VramfabricError) -> VramfabricError:
        """`exc`, carrying the end of what the process printed (its running chunk's text)."""
        if self.proc.capture is not None:
            with contextlib.suppress(OSError, ValueError):
                attach(exc, read_tail(self.proc.capture.fileno()))
        return exc
