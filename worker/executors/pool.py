"""ExecutorPool: the node's executor processes, which hold the execution slots of its leases.

Which process a lease's chunks run in is the layout's choice (worker/executors/layout.py): a
lane per lease for Python functions, one process per (GPU, tenant) with a thread per lease for
kernels. A node runs at most `max_executors_per_gpu` processes on a GPU and `max_executors`
in all: a process that would pass either cap waits for room, made by stopping an idle
process (a spare, a lane no chunk uses) or by one ending. A chunk past its deadline gets its
process killed: it fails as `timeout`, the process's other chunks learn they were
bystanders (handle.Bystander); a process that dies on its own with several chunks in it
makes each a suspect (handle.Suspect). ChunkRunner re-runs those; a suspect runs `alone`,
in a process of its own that is stopped once its chunk ends. Nothing here runs users' code:
it only moves bytes.

Which processes there are, how they start and the spares are ExecutorSupply's (supply.py);
with containment (worker/executors/containment.py) each process runs as its tenant's uid, so
there are no spares: a spare started before its tenant is known could run as nobody's uid.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import attrs

from vramfabric.broker.errors import ChunkTimeout
from vramfabric.broker.messages import Lease

from ..executor import ipc
from .handle import ExecutorProcess
from .layout import ALONE, IDLE, LANE, SPARE, ExecKey, alone_key
from .outcomes import FOR_A_NEIGHBOUR, Running, SaveCheckpoint
from .supply import ExecutorSupply
from .work import Work

log = logging.getLogger(__name__)

# Running chunks are checked against their deadlines this often (one timer per node, not
# one per chunk): a chunk is killed at most this long after its deadline.
DEADLINE_SWEEP_S = 0.1
# An executor no lease needs is stopped after this long idle (unless executor_idle_s says):
# on a real GPU each holds a CUDA context, VRAM the ledger does not count; on a simulated
# one only host memory (about 50 MiB, at most max_executors of them), and restarting a
# job's lanes costs seconds of CPU: 2 workers' 14 lanes after 45 s idle made the next
# 1,000-chunk job take 1.7 s instead of 0.18 s, and the three after it 0.3-0.44 s.
GPU_EXECUTOR_IDLE_S = 30.0
SIMULATED_EXECUTOR_IDLE_S = 600.0
# Uploaded works (functions, CUDA kernels) an executor keeps loaded: past this many it is
# stopped once idle, and the next chunk starts a fresh one (its memory is not collected).
MAX_WORKS_PER_EXECUTOR = 16


@attrs.define
class ExecutorPool(ExecutorSupply):
    """Runs chunks in the node's executor processes: lanes, deadlines, reaping, closing."""

    _ids: itertools.count[int] = attrs.field(factory=itertools.count, init=False)
    _sweep: asyncio.TimerHandle | None = attrs.field(default=None, init=False)

    async def run(
        self,
        lease: Lease,
        work: Work,
        frame: ipc.Run,
        timeout_s: float,
        save: SaveCheckpoint | None = None,
        alone: bool = False,
    ) -> tuple[bytes, float]:
        """Run one chunk in the lease's executor (or one of its own): its output and its cost.

        The cost is what the executor measured (`Running.cost_s`).

        Raises:
            ChunkTimeout: past `timeout_s` (the executor was killed).
            ExecutorCrashed: the executor died while the chunk ran.
            ChunkFailed: the chunk's work failed (a permanent kind, from the executor).
        """
        home = alone_key(lease) if alone else self.key_of(lease, work.kind)
        key = await self._lane_for(home) if home[2].startswith(LANE) else home
        self._last_busy = time.monotonic()
        exe = await self._enter(key)
        task_id = next(self._ids)
        loop = asyncio.get_running_loop()
        task = Running(loop.create_future(), save, loop.time() + timeout_s, timeout_s, home=home)
        exe.tasks[task_id] = task
        if self._sweep is None:
            self._sweep = loop.call_later(DEADLINE_SWEEP_S, self._check_deadlines)
        exe.leases.add(lease.lease_id)
        try:
            await self._send(exe, lease, work, frame, task_id)
            return await task.future, task.cost_s
        except asyncio.CancelledError:
            # Its caller gave up on it (an interactive call whose lease ended, a stopping
            # node): the work must not keep running, and holding the slot, in the process.
            # The cancel cancels the awaited future too: only a result means the work ended.
            # The slot's VRAM counts as free (ledger.vacate) only once the process is gone.
            if not task.future.done() or task.future.cancelled():
                await exe.stop(FOR_A_NEIGHBOUR)
            raise
        finally:
            exe.tasks.pop(task_id, None)
            self._left(exe, alone)

    async def _enter(self, key: ExecKey) -> ExecutorProcess:
        """The executor of `key`, started if need be; never reaped while a chunk enters it."""
        self._entering[key] = self._entering.get(key, 0) + 1
        try:
            return await self._executor(key)
        finally:
            left = self._entering.pop(key) - 1
            if left:
                self._entering[key] = left

    async def _send(
        self, exe: ExecutorProcess, lease: Lease, work: Work, frame: ipc.Run, task_id: int
    ) -> None:
        """Send the chunk's `run` frame, after the work's `load` frame if `exe` lacks it."""
        if work.blob is not None and work.digest not in exe.loaded:
            exe.loaded.add(work.digest)
            await exe.send(ipc.Load(digest=work.digest, kind=work.kind, blob=work.blob))
        run = frame.placed(
            task_id, work.kind, work.name, work.digest, lease.slice_bytes, lease.lease_id
        )
        await exe.send(run)

    def _left(self, exe: ExecutorProcess, alone: bool) -> None:
        """A chunk left `exe`: stop it if it is done for, wake chunks waiting for a lane."""
        self._last_busy = time.monotonic()
        if not exe.tasks:
            exe.idle_since = self._last_busy
            if alone:
                exe.kill("idle: its suspect chunk ended")
            elif len(exe.loaded) > MAX_WORKS_PER_EXECUTOR:
                # Every work it loaded stays in its memory: a fresh process starts clean.
                exe.kill(f"idle: recycled after loading {len(exe.loaded)} works")
        self.room.changed()
        self._lane_free.set()

    async def _lane_for(self, home: ExecKey) -> ExecKey:
        """The lane a chunk of lane `home` runs in: its own once started, else an idle one.

        A fresh job's leases each start a lane, a few at a time (`executor_starts`): on a
        small machine the last is up seconds after the first, and chunks bound to it would
        wait while lanes already up sit idle. So a chunk whose lane is not up yet runs in
        an idle lane of its tenant on its GPU, and never beside another lease's chunk: its
        own lane, running such a guest, is waited for like one still starting.
        """
        start: asyncio.Task[ExecutorProcess] | None = None
        while not self._closed:
            own = self._procs.get(home)
            if own is not None and own.alive and own.ready.done():
                if all(task.home == home for task in own.tasks.values()):
                    return home
            elif own is not None and own.alive:
                pass  # starting (a spare taken for it, still importing): its start wakes us
            elif start is not None and start.done():
                return home  # its start failed: the chunk learns why (`_executor`)
            else:
                start = self._start_task(home)  # up for the lease's next chunks
            for key, exe in self._procs.items():
                if (
                    key != home
                    and key[:2] == home[:2]
                    and key[2].startswith(LANE)
                    and exe.alive
                    and exe.ready.done()
                    and not exe.tasks
                    and key not in self._entering
                ):
                    return key
            self._lane_free.clear()
            await self._lane_free.wait()
        return home

    def _check_deadlines(self) -> None:
        """Kill the executors of chunks past their deadline; check again while chunks run."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        running = False
        for exe in list(self._procs.values()):
            for task in list(exe.tasks.values()):
                running = True
                if task.deadline <= now and not task.future.done():
                    self._timed_out(exe, task)
        if running:
            self._sweep = loop.call_later(DEADLINE_SWEEP_S, self._check_deadlines)

    def _timed_out(self, exe: ExecutorProcess, task: Running) -> None:
        log.warning(
            "chunk past its deadline key=%s timeout_s=%.1f: killing its executor",
            exe.key,
            task.timeout_s,
        )
        task.future.set_exception(exe.tailed(ChunkTimeout(task.timeout_s)))
        exe.kill(FOR_A_NEIGHBOUR)

    def reap(self, leases: set[str], now: float) -> int:
        """Stop executors no lease (of the ids in `leases`) has needed for `_idle_limit_s`.

        A lease's own process whose lease has ended, and a lane, are kept idle for the
        tenant's next lease on that GPU until then.
        """
        live = self.layout.live_keys(leases)
        stopped = 0
        for exe in self._procs.values():
            ended = exe.leases - leases
            exe.leases -= ended
            # A GPU executor keeps a stream and a capped pool per lease until told
            # (executor/work_runner.py).
            if ended and exe.alive and not self.gpus[exe.key[0]].simulated:
                exe.post(ipc.LeaseEnded(leases=tuple(sorted(ended))))
        for key, exe in list(self._procs.items()):
            if exe.tasks or key in live or key in self._entering or key[1:] == SPARE:
                continue
            if now - exe.idle_since > self._idle_limit_s(key[0]):
                exe.kill("idle: no lease needs it")
                stopped += 1
            elif key[2] and not key[2].startswith((IDLE, LANE, ALONE)):
                del self._procs[key]
                exe.key = (key[0], key[1], f"{IDLE}{exe.proc.pid}")
                self._procs[exe.key] = exe
        return stopped

    def _idle_limit_s(self, gpu: int) -> float:
        """How long an executor no lease needs stays up on `gpu`."""
        if self.settings.executor_idle_s is not None:
            return self.settings.executor_idle_s
        return SIMULATED_EXECUTOR_IDLE_S if self.gpus[gpu].simulated else GPU_EXECUTOR_IDLE_S

    async def close(self) -> None:
        """Kill every executor (chunks still running fail as crashed) and wait for them."""
        self._closed = True
        self._lane_free.set()
        if self._spares_in_turn is not None:
            self._spares_in_turn.cancel()
        for task in list(self._starting.values()):
            task.cancel()
        for exe in list(self._procs.values()):
            exe.kill("executor killed: the node is stopping")
        readers = [exe.reader for exe in self._procs.values() if exe.reader is not None]
        await asyncio.gather(*readers, return_exceptions=True)
        self.containment.close()
