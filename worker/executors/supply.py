"""ExecutorSupply: a node's executor processes, started within its caps, spares kept ready.

The processes are kept by key (handle.ExecKey): a lease's lane, its tenant's process on a
GPU, a spare bound to no tenant yet, a kept idle one. A start waits for room (room.py) and
its turn (`executor_starts` at once), and must say `ready` within START_PATIENCE_S. A spare
is a started process the first key that needs an executor on its GPU takes, so a job does
not wait for process starts; at start-up the agent probes that executors start at all
(`probe`). ExecutorPool (pool.py) runs chunks in these processes.
"""

from __future__ import annotations

import asyncio
import logging
import time

import attrs

from vramfabric.broker.errors import ExecutorCrashed
from vramfabric.broker.messages import Lease
from vramfabric.kernels.prebuild import start_prebuild

from ..node.gpus import GpuSpec
from ..node.settings import WorkerSettings
from .containment import Containment
from .handle import ExecutorProcess
from .layout import IDLE, LANE, SPARE, ExecKey, ExecutorLayout, spare_key
from .room import ExecutorRoom

log = logging.getLogger(__name__)

# A new executor must say `ready` within this long (imports, CUDA initialisation).
START_PATIENCE_S = 60.0
# Spare executors are started again once no chunk has run for this long.
SPARE_AFTER_IDLE_S = 5.0
# The tenant the start-up probe's executor runs as: not a token, so no real tenant's name.
PROBE_TENANT = ".probe"


@attrs.define
class ExecutorSupply:
    """The executor processes of one node: started, taken, kept as spares, ended."""

    settings: WorkerSettings
    gpus: tuple[GpuSpec, ...]
    _procs: dict[ExecKey, ExecutorProcess] = attrs.field(factory=dict, init=False)
    _starting: dict[ExecKey, asyncio.Task[ExecutorProcess]] = attrs.field(factory=dict, init=False)
    # Chunks on their way into an executor (it may still be starting): never reap those.
    _entering: dict[ExecKey, int] = attrs.field(factory=dict, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # When a lease last warmed or a chunk last started or ended here: spares are made only
    # after a quiet spell.
    _last_busy: float = attrs.field(default=float("-inf"), init=False)
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

    @property
    def starting(self) -> int:
        """Executor processes starting now: imports and CUDA set-up take the node's CPU."""
        return len(self._starting)

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
        return 1 if key[2] and key[1:] != SPARE else slices

    def _exited(self, exe: ExecutorProcess) -> None:
        self.room.ended(exe)
        self._lane_free.set()
        if self._procs.get(exe.key) is exe:
            del self._procs[exe.key]

    def _adopt_spare(self, key: ExecKey) -> ExecutorProcess | None:
        # An idle process of the same tenant on this GPU first (a lease's own process whose
        # lease has ended: starting one per lease per job would cost a process start each),
        # then the GPU's spare.
        idle = [
            exe
            for k, exe in self._procs.items()
            if k[:2] == key[:2] and k[2].startswith(IDLE) and exe.alive and exe.ready.done()
        ]
        spare = idle[0] if idle else self._procs.get(spare_key(key[0]))
        # A spare still starting is taken too: its chunks wait for it (`_executor`), rather
        # than for one more process started beside it on a busy machine.
        if spare is None or not spare.alive:
            return None
        del self._procs[spare.key]
        spare.key = key
        self._procs[key] = spare
        log.debug("spare executor taken key=%s pid=%d", key, spare.proc.pid)
        return spare

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
                self._start_task(spare_key(gpu.index))
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
        key = spare_key(gpu)
        # A spare never takes the room of a process that is (or may soon be) used.
        return (
            self.settings.eager_executors
            and key not in self._procs
            and key not in self._starting
            and not self.room.full(gpu)
        )

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
        spares = [t for key, t in self._starting.items() if key[1:] == SPARE]
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
                await asyncio.shield(self._start_task(spare_key(gpu.index)))
            except ExecutorCrashed:
                break  # logged by the start task; chunks that need one will say why
        self._prebuild()

    def _prebuild(self) -> None:
        # Simulated GPUs run registered CUDA on the host path. Started after the executors,
        # whose start it slowed down by a second on a 2-core machine.
        self._prebuild_due = False
        if self.gpus[0].simulated and not self._closed:
            start_prebuild(self.settings.kernel_modules)


def _log_failed_start(task: asyncio.Task[ExecutorProcess]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("executor start failed error=%s", task.exception())
