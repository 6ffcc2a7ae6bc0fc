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

With containment (worker/executors/containment.py) each process runs as its tenant's uid, so there
are no spares: a spare started before its tenant is known could run as nobody's uid.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import attrs

from vramfabric.broker.errors import ChunkTimeout, ExecutorCrashed
from vramfabric.broker.messages import Lease
from vramfabric.kernels.prebuild import start_prebuild

from ..node.gpus import GpuSpec
from ..node.settings import WorkerSettings
from .containment import Containment
from .handle import FOR_A_NEIGHBOUR, ExecKey, ExecutorProcess, Running, SaveCheckpoint
from .layout import ALONE, LANE, ExecutorLayout, alone_key
from .room import ExecutorRoom
from .work import Work

log = logging.getLogger(__name__)

# A new executor must say `ready` within this long (imports, CUDA initialisation).
START_PATIENCE_S = 60.0
# Spare executors are started again once no chunk has run for this long.
SPARE_AFTER_IDLE_S = 5.0
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
# The tenant the start-up probe's executor runs as: not a token, so no real tenant's name.
PROBE_TENANT = ".probe"


@attrs.define
class ExecutorPool:
    """Starts, feeds, times out and reaps the executor processes of one node."""

    settings: WorkerSettings
    gpus: tuple[GpuSpec, ...]
    _procs: dict[ExecKey, ExecutorProcess] = attrs.field(factory=dict, init=False)
    _starting: dict[ExecKey, asyncio.Task[ExecutorProcess]] = attrs.field(factory=dict, init=False)
    _ids: itertools.count[int] = attrs.field(factory=itertools.count, init=False)
    # Chunks on their way into an executor (it may still be starting): never reap those.
    _entering: dict[ExecKey, int] = attrs.field(factory=dict, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # When a lease last warmed or a chunk last started or ended here: spares are made only
    # after a quiet spell.
    _last_busy: float = attrs.field(default=float("-inf"), init=False)
    _sweep: asyncio.TimerHandle | None = attrs.field(default=None, init=False)
    # The spares started after a start-up that did not wait for them (see `probe`).
    _spares_in_turn: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    # The prebuild was put off by work that came before the start-up's spares (`_spares`).
    _prebuild_due: bool = attrs.field(default=False, init=False)
    # How executors are kept apart (its mode goes in adverts; it may refuse tenants' code).
    containment: Containment = attrs.field(init=False)
    layout: ExecutorLayout = attrs.field(init=False)
    room: ExecutorRoom = attrs.field(init=False)
    # At most `executor_starts` processes importing at once (see WorkerSettings).
    _starts: asyncio.Semaphore = attrs.field(init=False)
    # Set when a process is up or ends, or a chunk leaves one: chunks waiting for a lane.
    _lane_free: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        self._starts = asyncio.Semaphore(self.settings.executor_starts)
        s = self.settings
        self.containment = Containment.start(s.executor_uids, s.allow_code, s.allow_shared_uid)
        lanes = max(1, self.settings.max_executors_per_gpu - 1)  # one left to narrow suspects
        self.layout = ExecutorLayout(self.settings.isolation, lanes)
        self.room = ExecutorRoom(self.settings.max_executors_per_gpu, self.settings.max_executors)

    def __len__(self) -> int:
        return sum(1 for p in self._procs.values() if p.alive)

    def key_of(self, lease: Lease, kind: str) -> ExecKey:
        """The executor a lease's chunks of work `kind` run in (see worker/executors/layout.py)."""
        return self.layout.key_of(lease, kind)

    def warm(self, key: ExecKey) -> None:
        """Start an executor now, so the first chunk of its leases does not wait for it."""
        self._last_busy = time.monotonic()
        if not self.settings.eager_executors:
            return
        exe = self._procs.get(key) or self._adopt_spare(key)
        if not self._closed and (exe is None or not exe.alive):
            self._start_task(key)

    async def run(
        self,
        lease: Lease,
        work: Work,
        frame: dict[str, Any],
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
        self._entering[key] = self._entering.get(key, 0) + 1
        try:
            exe = await self._executor(key)
        finally:
            left = self._entering.pop(key) - 1
            if left:
                self._entering[key] = left
        task_id = next(self._ids)
        loop = asyncio.get_running_loop()
        task = Running(loop.create_future(), save, loop.time() + timeout_s, timeout_s, home=home)
        exe.tasks[task_id] = task
        if self._sweep is None:
            self._sweep = loop.call_later(DEADLINE_SWEEP_S, self._check_deadlines)
        exe.leases.add(lease.lease_id)
        try:
            if work.blob is not None and work.digest not in exe.loaded:
                exe.loaded.add(work.digest)
                await exe.send(
                    {"op": "load", "digest": work.digest, "kind": work.kind, "blob": work.blob}
                )
            await exe.send(
                {
                    **frame,
                    "op": "run",
                    "task": task_id,
                    "kind": work.kind,
                    "name": work.name,
                    "digest": work.digest,
                    "slice_bytes": lease.slice_bytes,
                    "lease": lease.lease_id,
                }
            )
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

    async def _executor(self, key: ExecKey) -> ExecutorProcess:
        exe = self._procs.get(key) or self._adopt_spare(key)
        if exe is not None and exe.alive:
            if not exe.ready.done():
                # Still starting (warmed at grant time): a chunk's deadline starts after this.
                await asyncio.shield(exe.ready)
            return exe
        if self._closed:
            raise ExecutorCrashed("the node is draining: no new executor")
        # Shielded: one chunk giving up must not cancel a start other chunks wait for.
        return await asyncio.shield(self._start_task(key))

    def keep_spares(self) -> None:
        """Start a spare executor for each GPU that has none, unless chunks are running.

        A spare is a started process bound to no tenant yet: the first key that needs an
        executor on its GPU takes it, so a job does not wait for (or compete with) process
        starts. Spares are made again only after the node has been idle a while: starting
        processes between two jobs of a burst would slow the second one down.
        """
        if self._spares_in_turn is not None and not self._spares_in_turn.done():
            return  # the start-up's spares are still coming, one at a time
        for gpu in self.gpus:
            if self._spare_wanted(gpu.index):
                self._start_task(_spare_key(gpu.index))
        if self._prebuild_due and self._idle():
            self._prebuild()

    def _idle(self) -> bool:
        """Whether no chunk runs here and none has for a while (nor a lease was warmed)."""
        quiet = time.monotonic() - self._last_busy > SPARE_AFTER_IDLE_S
        return not self._closed and quiet and not any(exe.tasks for exe in self._procs.values())

    def _spare_wanted(self, gpu: int) -> bool:
        """Whether to start a spare for `gpu` now (none there, the node idle a while)."""
        if not self._idle() or self.containment.uids is not None:
            return False
        key = _spare_key(gpu)
        # A spare never takes the room of a process that is (or may soon be) used.
        return (
            self.settings.eager_executors
            and key not in self._procs
            and key not in self._starting
            and not self.room.full(gpu)
        )

    def _adopt_spare(self, key: ExecKey) -> ExecutorProcess | None:
        # An idle process of the same tenant on this GPU first (a lease's own process whose
        # lease has ended: starting one per lease per job would cost a process start each),
        # then the GPU's spare.
        idle = [
            exe
            for k, exe in self._procs.items()
            if k[:2] == key[:2] and k[2].startswith(_IDLE) and exe.alive and exe.ready.done()
        ]
        spare = idle[0] if idle else self._procs.get(_spare_key(key[0]))
        # A spare still starting is taken too: its chunks wait for it (`_executor`), rather
        # than for one more process started beside it on a busy machine.
        if spare is None or not spare.alive:
            return None
        del self._procs[spare.key]
        spare.key = key
        self._procs[key] = spare
        log.debug("spare executor taken key=%s pid=%d", key, spare.proc.pid)
        return spare

    def _start_task(self, key: ExecKey) -> asyncio.Task[ExecutorProcess]:
        task = self._starting.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._start(key))
            self._starting[key] = task
            task.add_done_callback(lambda _t: self._starting.pop(key, None))
            task.add_done_callback(lambda _t: self._lane_free.set())
            # A warm-up nobody awaits: log its failure here (chunks that wait get it raised).
            task.add_done_callback(_log_failed_start)
        return task

    async def _start(self, key: ExecKey) -> ExecutorProcess:
        await self.room.reserve(key[0], lambda k: k in self._entering)
        try:
            await self._starts.acquire()
        except asyncio.CancelledError:
            self.room.started(key[0], None)  # cancelled waiting for its turn: its room back
            raise
        try:
            return await self._spawn(key)
        finally:
            self._starts.release()

    async def _spawn(self, key: ExecKey) -> ExecutorProcess:
        gpu = self.gpus[key[0]]
        exe = None
        try:
            sandbox = self.containment.sandbox(key[1]) if key[1] else None
            exe = await ExecutorProcess.spawn(
                key, gpu, self.settings.kernel_modules, self._exited, self._slots(key), sandbox
            )
        except LookupError as exc:  # no uid left for this tenant: another node may have one
            raise ExecutorCrashed(str(exc)) from exc
        except OSError as exc:  # out of processes, files or memory: the node's fault
            raise ExecutorCrashed(f"executor process could not start: {exc}") from exc
        finally:
            self.room.started(key[0], exe)
        self._procs[key] = exe
        try:
            await asyncio.wait_for(asyncio.shield(exe.ready), START_PATIENCE_S)
        except TimeoutError:
            exe.kill("executor did not start")
            raise ExecutorCrashed(f"executor did not start within {START_PATIENCE_S:g} s") from None
        log.info("executor started key=%s pid=%d", key, exe.proc.pid)
        return exe

    def _slots(self, key: ExecKey) -> int:
        """Chunks a new process may run at once: its threads to start with it."""
        slices = max(1, self.gpus[key[0]].total_bytes // self.settings.slice_bytes)
        if key[2].startswith(LANE):
            return -(-slices // self.layout.lanes)  # leases past the lanes share them
        return 1 if key[2] and key[1:] != _SPARE else slices

    def _exited(self, exe: ExecutorProcess) -> None:
        self.room.ended(exe)
        self._lane_free.set()
        if self._procs.get(exe.key) is exe:
            del self._procs[exe.key]

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
                exe.post({"op": "lease_ended", "leases": sorted(ended)})
        for key, exe in list(self._procs.items()):
            if exe.tasks or key in live or key in self._entering or key[1:] == _SPARE:
                continue
            if now - exe.idle_since > self._idle_limit_s(key[0]):
                exe.kill("idle: no lease needs it")
                stopped += 1
            elif key[2] and not key[2].startswith((_IDLE, LANE, ALONE)):
                del self._procs[key]
                exe.key = (key[0], key[1], f"{_IDLE}{exe.proc.pid}")
                self._procs[exe.key] = exe
        return stopped

    def _idle_limit_s(self, gpu: int) -> float:
        """How long an executor no lease needs stays up on `gpu`."""
        if self.settings.executor_idle_s is not None:
            return self.settings.executor_idle_s
        return SIMULATED_EXECUTOR_IDLE_S if self.gpus[gpu].simulated else GPU_EXECUTOR_IDLE_S

    @property
    def vouched(self) -> bool:
        """Whether this agent's own start shows that its executors can start too.

        An executor is then this interpreter, as this uid, on a simulated GPU, importing no
        module the agent did not: nothing can stop it that has not already stopped the agent.
        Another uid (which may not run the interpreter), a real GPU (CUDA to initialise) or
        an operator's `--kernel-module` (imported in the executors' environment) must be
        shown by starting one (`probe`).
        """
        return (
            self.gpus[0].simulated
            and self.containment.uids is None
            and not self.settings.kernel_modules
        )

    async def probe(self) -> None:
        """Make sure executors start here: a spare per GPU, or one started and stopped.

        Where the agent vouches for its executors (`vouched`) this returns at once: the
        spares start in the background, one after another (a chunk that comes first takes its
        GPU's spare, started or starting, or starts its own), or none without
        `eager_executors`.

        Raises:
            ExecutorCrashed: it did not start (or say ready within START_PATIENCE_S), e.g.
                its uid may not run the interpreter: this node cannot run chunks.
        """
        if self.vouched:
            if self.settings.eager_executors:
                self._spares_in_turn = asyncio.get_running_loop().create_task(self._spares())
            else:
                self._prebuild()
            return
        self.keep_spares()
        spares = [t for key, t in self._starting.items() if key[1:] == _SPARE]
        if spares:  # the spares are the probe: they start as tenants' executors would
            await asyncio.gather(*(asyncio.shield(t) for t in spares))
        else:
            exe = await self._start((0, PROBE_TENANT, "probe"))
            exe.kill("idle: the start-up probe is done")
            if exe.reader is not None:
                await exe.reader
        self._prebuild()

    async def _spares(self) -> None:
        """Start a spare per GPU in turn, until the node gets work; then the prebuild.

        One at a time: started together on a small machine, every spare (and the first
        chunk's executor among them) would be ready only when the last one is.
        """
        for gpu in self.gpus:
            if not self._spare_wanted(gpu.index):
                # Work came first: the prebuild (0.4 s of CPU even with nothing to build)
                # waits for a quiet spell (keep_spares) rather than slow the first job.
                self._prebuild_due = True
                return
            try:
                await asyncio.shield(self._start_task(_spare_key(gpu.index)))
            except ExecutorCrashed:
                break  # logged by the start task; chunks that need one will say why
        self._prebuild()

    def _prebuild(self) -> None:
        # Simulated GPUs run registered CUDA on the host path. Started after the executors,
        # whose start it slowed down by a second on a 2-core machine.
        self._prebuild_due = False
        if self.gpus[0].simulated and not self._closed:
            start_prebuild(self.settings.kernel_modules)

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


_SPARE = ("", "spare")
# Third key field of a lease's own process kept after its lease ended.
_IDLE = "idle:"


def _log_failed_start(task: asyncio.Task[ExecutorProcess]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("executor start failed error=%s", task.exception())


def _spare_key(gpu: int) -> ExecKey:
    return (gpu, *_SPARE)
