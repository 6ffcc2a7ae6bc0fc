"""An executor process: runs chunks for one GPU (and one tenant) on one thread per lease.

Started by the node agent (`worker/executors/handle.py`) as `python -m vramfabric.worker.executor`.
Frames (worker/executor/ipc.py) come in on stdin and go out on a private copy of stdout; the real
stdout is pointed at stderr so that a user's `print` cannot corrupt the frame stream. Each
`run` frame runs on its own thread (worker/executor/work_runner.py runs the work). This process may
crash, hang or be killed at any time: the agent fails its running chunks and starts another.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pickle
import sys
import threading
import time
from typing import BinaryIO

from vramfabric.broker.errors import ErrorKind
from vramfabric.kernels import builtin_registry
from vramfabric.kernels.code import Context, python_version
from vramfabric.kernels.host_cache import UNUSED_S
from vramfabric.kernels.registry import load_registry
from vramfabric.kernels.settings import CudaSettings

from . import ipc
from .captured import Captured
from .hardening import make_undumpable
from .leftovers import Leftovers, become_subreaper
from .packs import run_pack
from .work_runner import Failure, WorkRunner, full_traceback, is_cuda_error, summary

# How long `ctx.checkpoint()` waits for the agent to store the state.
CHECKPOINT_TIMEOUT_S = 30.0
# Threads of one executor process at most: one per lease that can run in it. The first
# PRESTART_THREADS are started with the process, the rest when a burst needs them.
MAX_THREADS = 4096
PRESTART_THREADS = 256
# Exit code when a CUDA error may have poisoned this process's context.
EXIT_POISONED = 70
# The largest output a chunk may return: it must fit in one frame beside the rest of its
# `done` frame. A larger one fails its chunk here, at once, instead of breaking the pipe.
MAX_OUTPUT_BYTES = ipc.MAX_FRAME_BYTES - 64 * 2**10


class Executor:
    """The loop of one executor process."""

    def __init__(
        self, args: argparse.Namespace, out: BinaryIO, captured: Captured | None = None
    ) -> None:
        """Build the registry and the device handles for `args`.

        `captured`: what chunks print, read back for a failed chunk's result (none: not).
        """
        self.runner = WorkRunner(
            lambda: load_registry(builtin_registry(), args.kernel_module), args.simulated
        )
        self._out = out
        # Frames waiting to be written, and whether a thread is writing them now.
        self._pending: list[bytes] = []
        self._pending_lock = threading.Lock()
        self._flushing = False
        self._checkpoints: dict[int, tuple[threading.Event, list[str | None]]] = {}
        # Processes chunks started and left running: killed once no chunk runs here.
        self._leftovers = Leftovers()
        self._captured = captured or Captured(None)
        # One thread per lease that may run here (the agent sends one chunk per lease at a
        # time), started now: a thread started mid-burst waits for the GIL behind the busy
        # ones, and a burst of them stalled the first job for most of a second.
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=MAX_THREADS, thread_name_prefix="vf-lease"
        )
        _prestart(self._pool, min(args.slots, PRESTART_THREADS))

    def send(self, frame: ipc.Frame) -> None:
        """Write one frame to the agent (from any thread).

        Frames of chunks that end together go out in one write: the thread that finds no
        write in progress writes everything queued meanwhile, so a burst of short chunks
        costs a few system calls, not one per chunk.
        """
        data = ipc.encode(frame)
        with self._pending_lock:
            self._pending.append(data)
            if self._flushing:
                return
            self._flushing = True
        while True:
            with self._pending_lock:
                if not self._pending:
                    self._flushing = False
                    return
                batch = b"".join(self._pending)
                self._pending.clear()
            self._out.write(batch)
            self._out.flush()

    def serve(self, inp: BinaryIO) -> None:
        """Handle frames until the agent closes the pipe."""
        self.send(ipc.Ready(python=python_version()))
        while True:
            header = inp.read(ipc.HEADER_BYTES)
            if len(header) < ipc.HEADER_BYTES:
                return
            frame = ipc.decode(_read_exact(inp, ipc.length_of(header)))
            if isinstance(frame, ipc.Load):
                self.runner.add_blob(frame.digest, frame.blob)
            elif isinstance(frame, ipc.Run):
                self._pool.submit(self._run, frame)
            elif isinstance(frame, ipc.LeaseEnded):
                for lease_id in frame.leases:
                    self.runner.end_lease(lease_id)
            elif isinstance(frame, ipc.Checkpointed):
                waiter = self._checkpoints.get(frame.task)
                if waiter is not None:
                    waiter[1].append(frame.error)
                    waiter[0].set()

    def _run(self, frame: ipc.Run) -> None:
        self._leftovers.enter()
        printed_from = self._captured.start()
        try:
            reply = self._outcome(frame, printed_from)
        finally:
            self._captured.end()
            # Before `done`: once the agent has the outcome, nothing of the chunk runs.
            self._leftovers.leave()
        self.send(reply)

    def _outcome(self, frame: ipc.Run, printed_from: int) -> ipc.Done:
        """The `done` frame for a `run` frame (a CUDA error ends this process instead).

        A failed chunk's frame carries what it printed since `printed_from` (its end).
        """
        task = frame.task
        start = time.perf_counter()
        try:
            if frame.inputs is not None:
                output = self._run_pack(frame, printed_from)
            else:
                # Made only for work that reads it: a `ctx` costs a call more than its work.
                ctx = self._context(frame) if self.runner.wants_context(frame) else None
                output = self.runner.execute(frame, ctx)
            if len(output) > MAX_OUTPUT_BYTES:
                raise Failure(
                    ErrorKind.LAUNCH_FAILED,
                    f"output of {len(output)} bytes exceeds the largest a chunk may return, "
                    f"{MAX_OUTPUT_BYTES} bytes (the executor frame limit)",
                )
            return ipc.Done(task=task, ok=True, output=output, cost_s=time.perf_counter() - start)
        except Failure as exc:
            printed = self._captured.tail(printed_from)
            return ipc.Done(
                task=task, ok=False, kind=exc.kind.value, error=str(exc), printed=printed
            )
        except Exception as exc:  # recorded: the chunk's `done` frame names it (or a CUDA exit)
            if is_cuda_error(exc):
                # A CUDA error can leave the context unusable for every thread: report, then
                # die, and the agent fails this process's other chunks and starts another.
                self.send(
                    ipc.Done(
                        task=task,
                        ok=False,
                        kind="crashed",
                        error=f"CUDA error, executor restarted: {exc}",
                    )
                )
                os._exit(EXIT_POISONED)
            # Unexpected exceptions in user code are permanent: the message names the cause.
            return ipc.Done(
                task=task,
                ok=False,
                kind=ErrorKind.ERROR.value,
                error=summary(exc),
                traceback=full_traceback(exc),
                printed=self._captured.tail(printed_from),
            )

    def _run_pack(self, frame: ipc.Run, printed_from: int = 0) -> bytes:
        """Run a pack's chunks one after another; their outcomes, each its own."""
        return run_pack(self.runner, self._captured, frame, printed_from)

    def _context(self, frame: ipc.Run) -> Context:
        task, resumed = frame.task, frame.resumed
        return Context(
            device=self.runner.gpu,
            slice_bytes=frame.slice_bytes,
            xp=self.runner.array_module,
            attempt=frame.attempt,
            job=frame.job,
            index=frame.index,
            resumed=None if resumed is None else pickle.loads(resumed),
            save=lambda state: self._checkpoint(task, state),
        )

    def _checkpoint(self, task: int, state: bytes) -> None:
        if len(state) > ipc.MAX_CHECKPOINT_BYTES:
            raise ValueError(
                f"checkpoint of {len(state)} bytes exceeds {ipc.MAX_CHECKPOINT_BYTES} bytes"
            )
        waiter: tuple[threading.Event, list[str | None]] = (threading.Event(), [])
        self._checkpoints[task] = waiter
        try:
            self.send(ipc.Checkpoint(task=task, state=state))
            if not waiter[0].wait(CHECKPOINT_TIMEOUT_S):
                raise RuntimeError(f"checkpoint not stored within {CHECKPOINT_TIMEOUT_S:g} s")
            if waiter[1][0] is not None:
                raise RuntimeError(f"checkpoint not stored: {waiter[1][0]}")
        finally:
            del self._checkpoints[task]


def _prestart(pool: concurrent.futures.ThreadPoolExecutor, n: int) -> None:
    """Make the pool start `n` threads now (it starts one per task while none is idle)."""
    barrier = threading.Barrier(n + 1)
    for _ in range(n):
        pool.submit(barrier.wait)
    barrier.wait()


def _read_exact(inp: BinaryIO, n: int) -> bytes:
    parts, left = [], n
    while left:
        part = inp.read(left)
        if not part:
            raise EOFError("agent closed the pipe mid-frame")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _private_pipes() -> tuple[BinaryIO, BinaryIO]:
    """Frame pipes on private descriptors; fd 0 becomes /dev/null and fd 1 goes to stderr."""
    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return inp, out


def _prune_host_cache() -> None:
    """Delete this uid's host-path libraries no process used for a month."""
    cache = CudaSettings.from_env().cache()
    try:
        cache.prune(UNUSED_S, time.time())
    except OSError as exc:  # an unreadable folder: nothing this process can collect
        print(f"vramfabric-executor: host cache not pruned: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m vramfabric.worker.executor`."""
    # Exec made this process dumpable again: one tenant's code must not read another's.
    make_undumpable()
    parser = argparse.ArgumentParser(prog="vramfabric-executor")
    parser.add_argument("--simulated", action="store_true")
    parser.add_argument("--cpus", default="", help="comma-separated CPU ids to run on")
    parser.add_argument("--kernel-module", action="append", default=[])
    parser.add_argument("--slots", type=int, default=1, help="leases that may run here at once")
    args = parser.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    inp, out = _private_pipes()
    # What chunks start is reaped here, never by init: killed once they end (leftovers.py).
    become_subreaper()
    # Beside the frames, not before them: a start stays as quick as it was.
    threading.Thread(target=_prune_host_cache, name="prune", daemon=True).start()
    # stderr (and so stdout) is the agent's capture file (captured.py).
    Executor(args, out, Captured(2)).serve(inp)
    # The agent is gone or done with us: do not wait for chunks that may hang.
    os._exit(0)
