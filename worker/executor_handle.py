"""ExecutorProcess: one executor process as the agent sees it, and the chunks it runs.

It starts `python -m vramfabric.worker.executor` for one GPU, writes frames to its stdin,
reads frames from its stdout, resolves each running chunk's future from them, stores the
checkpoints the chunks send, and fails every chunk still running when the process ends,
whatever ended it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from vramfabric.broker.errors import ChunkFailed, ErrorKind, ExecutorCrashed, VramfabricError
from vramfabric.broker.server import die_with_parent
from vramfabric.kernels.cuda_compile import KernelCompileError
from vramfabric.kernels.host_cache import BUILTINS_MODE, own_folder
from vramfabric.kernels.settings import CudaSettings

from . import ipc
from .containment import Sandbox, executor_env
from .gpus import GpuSpec

log = logging.getLogger(__name__)

# How the pool kills a process for one chunk's deadline: its other chunks are innocent.
FOR_A_NEIGHBOUR = "executor killed: a chunk beside this one ran past its deadline"

# (gpu, tenant, lease id or "" when the lease shares its tenant's process on that GPU); also
# (gpu, "", "spare") for a GPU's spare and (gpu, tenant, "idle:<pid>") for a kept idle one.
ExecKey = tuple[int, str, str]
# A frame larger than this is written at once and its writer waits for the pipe to drain.
_DRAIN_ABOVE_BYTES = 64 * 2**10
SaveCheckpoint = Callable[[bytes], Awaitable[None]]
# The only VRAMFABRIC_ variables an executor gets, set for it here (never the worker's own).
EXECUTOR_SETTINGS = ("VRAMFABRIC_CUDA_CHECK", "VRAMFABRIC_HOST_BUILTINS", "VRAMFABRIC_HOST_CACHE")


class Bystander(ExecutorCrashed):
    """The chunk's executor ended for another chunk's sake: run it again, it pays nothing.

    Never leaves the worker (ChunkRunner re-runs the chunk), so it has no wire kind of its own.
    """


class Suspect(ExecutorCrashed):
    """The chunk's executor crashed while other chunks ran there too: any of them may be why."""


@attrs.define
class Running:
    """A chunk running in an executor: its output to come, and where its checkpoints go."""

    future: asyncio.Future[bytes]
    save: SaveCheckpoint | None
    # Monotonic time past which the chunk is killed, and its deadline in seconds.
    deadline: float = float("inf")
    timeout_s: float = 0.0
    # The seconds the work ran in its executor thread (no wait for the process to start or
    # for the frame to be read): packing reads it.
    cost_s: float = 0.0
    # The process its lease's chunks belong in (worker/layout.py); it may run in another
    # lane of its tenant while that one is still starting (ExecutorPool).
    home: ExecKey | None = None


@attrs.define(eq=False)
class ExecutorProcess:
    """One executor process and the chunks it is running."""

    key: ExecKey
    proc: asyncio.subprocess.Process
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
        args: list[str] = ["--slots", str(slots)]
        for module in kernel_modules:
            args += ["--kernel-module", module]
        # Users' code runs there: it gets none of the worker's settings, NATS credentials
        # included (VRAMFABRIC_NATS_PASSWORD, VRAMFABRIC_NATS_CREDS, ...).
        env = executor_env(os.environ, sandbox)
        # Kernels reach executors checked (by the coordinator, or this agent's prebuild):
        # importing NVRTC to check them again cost each process 0.2 s (kernels/settings.py).
        env["VRAMFABRIC_CUDA_CHECK"] = "0"
        user: dict[str, Any] = {}
        # -s: no user site-packages from HOME; -P: not the tenant's own cwd first on the path.
        flags = ["-s", "-P"] if sandbox else []
        if sandbox is not None:
            user = {"user": sandbox.uid, "group": sandbox.gid, "extra_groups": []}
            user["cwd"] = sandbox.home
        if gpu.simulated:
            args.append("--simulated")
            # The node's built-in host kernels (kernels/prebuild.py), built by this agent.
            cuda = CudaSettings.from_env()
            # Made here, as this uid's: an executor of a tenant's uid must never make it.
            with contextlib.suppress(KernelCompileError, OSError):
                own_folder(cuda.builtins_dir, BUILTINS_MODE)
            env["VRAMFABRIC_HOST_BUILTINS"] = str(cuda.builtins_dir)
            if sandbox is None:  # a contained executor builds in its own private folder
                env["VRAMFABRIC_HOST_CACHE"] = str(cuda.host_cache)
        else:
            # The process sees its GPU alone, as device 0.
            env["CUDA_VISIBLE_DEVICES"] = gpu.uuid or str(gpu.index)
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if gpu.cpus:
            args += ["--cpus", ",".join(map(str, gpu.cpus))]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *flags,
            "-m",
            "vramfabric.worker.executor",
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            # Runs after the uid switch, which would clear the parent-death signal.
            preexec_fn=die_with_parent,
            **user,
        )
        exe = cls(key, proc, on_exit)
        exe.reader = asyncio.get_running_loop().create_task(exe._read())
        return exe

    @property
    def alive(self) -> bool:
        """Whether the process has not exited (nor been told to)."""
        return self.proc.returncode is None and not self.doom

    async def send(self, frame: dict[str, Any]) -> None:
        """Queue one frame for the next write; ExecutorCrashed if the process is gone.

        Frames sent in one turn of the event loop (a burst of chunks) go out in one write,
        not one system call each. A frame lost with the process fails its chunk through the
        reader (`_died`), as any chunk running there does.
        """
        stdin = self.proc.stdin
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

    def post(self, frame: dict[str, Any]) -> bytes:
        """Queue one frame for the next write without waiting; return its bytes."""
        data = ipc.pack(frame)
        self._outbox.append(data)
        if len(self._outbox) == 1:
            asyncio.get_running_loop().call_soon(self._flush)
        return data

    def _flush(self) -> None:
        if not self._outbox:
            return
        data = b"".join(self._outbox)
        self._outbox.clear()
        stdin = self.proc.stdin
        assert stdin is not None
        # Best effort: if the process is gone its reader fails the chunks these frames carried.
        with contextlib.suppress(ConnectionError, RuntimeError):
            stdin.write(data)

    def kill(self, why: str) -> None:
        """SIGKILL the process; its running chunks fail with `why`."""
        if not self.doom:
            self.doom = why
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            while True:
                header = await stdout.readexactly(ipc.HEADER_BYTES)
                self._on_frame(ipc.unpack(await stdout.readexactly(ipc.length_of(header))))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the process is gone: see below
        except (ValueError, TypeError, KeyError) as exc:
            # A garbled frame (users' code runs there): the process cannot be trusted now.
            self.kill(f"executor sent a bad frame: {type(exc).__name__}: {exc}")
        await self._died()

    def _on_frame(self, frame: dict[str, Any]) -> None:
        op = frame["op"]
        if op == "ready":
            if not self.ready.done():
                self.ready.set_result(None)
            return
        task = self.tasks.get(frame.get("task", -1))
        if task is None:
            return  # a chunk that already failed (its deadline passed)
        if op == "done" and not task.future.done():
            if frame.get("ok"):
                task.cost_s = float(frame.get("cost_s", 0.0))
                task.future.set_result(bytes(frame["output"]))
            else:
                error = _failure(frame)
                self.culprit_known |= isinstance(error, ExecutorCrashed)
                task.future.set_exception(error)
        elif op == "checkpoint":
            # Stored off the read loop: the executor may finish other chunks meanwhile.
            stored = asyncio.get_running_loop().create_task(self._checkpoint(frame, task))
            self._storing.add(stored)
            stored.add_done_callback(self._storing.discard)

    async def _checkpoint(self, frame: dict[str, Any], task: Running) -> None:
        error: str | None = None
        try:
            state = bytes(frame["state"])
            if task.save is None:
                raise ValueError("this chunk cannot checkpoint")
            if len(state) > ipc.MAX_CHECKPOINT_BYTES:
                raise ValueError(f"checkpoint of {len(state)} bytes is over the limit")
            await task.save(state)
        except (VramfabricError, ValueError, TypeError, KeyError) as exc:
            error = str(exc)
        with contextlib.suppress(ExecutorCrashed):
            await self.send({"op": "checkpointed", "task": frame["task"], "error": error})

    async def _died(self) -> None:
        code = await self.proc.wait()
        why = self.doom or f"executor process died ({_exit_reason(code)}) while running this chunk"
        running = [task for task in self.tasks.values() if not task.future.done()]
        for task in running:
            task.future.set_exception(self._verdict(why, len(running)))
        if not self.ready.done():
            self.ready.set_exception(ExecutorCrashed(why))
            self.ready.exception()  # retrieved: the starter reports it
        self.on_exit(self)
        quiet = self.doom.startswith(("idle", "executor killed: the node"))
        level = logging.INFO if quiet else logging.WARNING
        log.log(level, "executor ended key=%s pid=%d %s", self.key, self.proc.pid, why)

    def _verdict(self, why: str, running: int) -> ExecutorCrashed:
        """What a chunk still running when the process ended learns, by who is to blame."""
        if self.culprit_known or self.doom == FOR_A_NEIGHBOUR:
            return Bystander(why)
        if self.doom.startswith(("idle", "executor killed: the node")) or running == 1:
            return ExecutorCrashed(why)
        # Died on its own (or sent garbage) with several chunks in it: each is a suspect.
        return Suspect(why)


def _failure(frame: dict[str, Any]) -> VramfabricError:
    """The error a `done` frame reports."""
    message = str(frame.get("error", ""))
    try:
        kind = ErrorKind(frame.get("kind", ""))
    except ValueError:
        kind = ErrorKind.ERROR
    if kind is ErrorKind.CRASHED:
        return ExecutorCrashed(message)
    return ChunkFailed(kind, message)


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
