"""A bad chunk costs only itself (issue 13), on real worker processes.

A chunk that hangs or crashes its executor fails; the chunks that shared that process run
again on this worker without spending a delivery (all jobs here allow no retry), suspects
of a crash are narrowed without the node passing its executor caps, an output too large
for the executor frame fails at once, and a worker whose executors cannot start never says
ready and still stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import eventually, poll_until
from tests.integration.conftest import AgentFactory, FabricFactory, WorkerProcess
from vramfabric.broker import BrokerSettings, ErrorKind, RetryPolicy
from vramfabric.coordinator import Fabric, Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.worker.executor.process import MAX_OUTPUT_BYTES

NO_RETRY = RetryPolicy(max_retries=0)
# One GPU's leases all share one process: at most 2 executors per GPU (a lane + 1 to narrow).
CAP_ENV = {"VRAMFABRIC_MAX_EXECUTORS_PER_GPU": "2", "VRAMFABRIC_MAX_EXECUTORS": "2"}


def hang_or_crash(spec: dict[str, Any]) -> int:
    """Hang forever, segfault, or sleep `sleep_s` and return the index, as `spec` says."""
    if spec.get("hang"):
        while True:
            time.sleep(1)  # a kernel that never ends
    if spec.get("segfault"):
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    time.sleep(spec["sleep_s"])  # stands in for a kernel that runs this long
    return int(spec["i"])


def executor_children(pid: int) -> int:
    """How many executor processes `pid` has as children now, from /proc."""
    count = 0
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                count += b"vramfabric.worker.executor" in f.read()
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
    return count


async def run_counting(fabric: Fabric, job: Job, pid: int) -> tuple[Any, int]:
    """Run `job` on 12 leases; the result and the most executors `pid` had at once."""
    peak = 0
    run = asyncio.create_task(fabric.run(job, Gather(), slices=12, timeout_s=110))
    while not run.done():
        peak = max(peak, executor_children(pid))
        await asyncio.sleep(0.01)  # sampling interval, not synchronisation
    return run.result(), peak


def _leased(fabric: Fabric) -> int:
    return sum(g.leased_bytes for a in fabric.fleet.adverts.values() for g in a.gpus)


@pytest.mark.timeout(120)
async def test_hung_chunk_among_23_healthy_ones_fails_alone_as_timeout(
    fabric_factory: FabricFactory,
    worker_process: WorkerProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a worker whose 12 leases on one GPU share one executor process, and a job of 24
    # chunks of 2 s that allows no retry, whose chunk 5 hangs past its 3 s deadline (while
    # the second round of healthy chunks runs beside it)
    for name, value in CAP_ENV.items():
        monkeypatch.setenv(name, value)
    proc = worker_process("n1", "--allow-code", "--simulate", "1x12GiB")
    fabric = await fabric_factory(ack_wait_s=3.0)
    specs = [{"i": i, "hang": i == 5, "sleep_s": 2.0} for i in range(24)]
    job = Job(hang_or_crash, specs, timeout_s=3.0, retry=NO_RETRY)
    # When it runs
    result, peak = await run_counting(fabric, job, proc.pid)
    # Then the 11 chunks killed with it ran again: 23 ok, and only the hung one failed
    assert result.n_ok == 23, result.failures
    (failure,) = result.failures
    assert failure.index == 5 and failure.error_kind is ErrorKind.TIMEOUT
    assert peak <= 2


@pytest.mark.timeout(120)
async def test_segfault_among_23_healthy_ones_fails_only_the_culprit_within_the_caps(
    fabric_factory: FabricFactory,
    worker_process: WorkerProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the same worker (2 executors at most) and a job whose chunk 5 segfaults each time
    for name, value in CAP_ENV.items():
        monkeypatch.setenv(name, value)
    proc = worker_process("n1", "--allow-code", "--simulate", "1x12GiB")
    fabric = await fabric_factory(ack_wait_s=3.0)
    specs = [{"i": i, "segfault": i == 5, "sleep_s": 0.5} for i in range(24)]
    job = Job(hang_or_crash, specs, retry=NO_RETRY)
    # When it runs (12 chunks die together, each a suspect to run again alone)
    result, peak = await run_counting(fabric, job, proc.pid)
    # Then only the culprit failed, as a crash naming the signal
    assert result.n_ok == 23, result.failures
    (failure,) = result.failures
    assert failure.index == 5 and failure.error_kind is ErrorKind.CRASHED
    assert "SIGSEGV" in (failure.error or "")
    # And the node never ran more executors than its cap while narrowing the suspects
    assert 1 <= peak <= 2


async def test_a_functions_leases_run_in_processes_of_their_own(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node with the default layout (isolation "thread")
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    # When a Python function runs on 4 leases
    result = await fabric.run(Job(pid_span, [0.3] * 4), Gather(), slices=4, timeout_s=30)
    # Then no two leases' chunks ran in one process at once: Python work is not serialised
    # by one GIL (a chunk whose lease's process is still starting may run in another's once
    # that one is idle)
    spans = sorted(result.value)
    assert len({pid for pid, _start, _end in spans}) >= 2
    for (pid, _start, end), (next_pid, next_start, _end) in itertools.pairwise(spans):
        assert pid != next_pid or end <= next_start


def pid_span(seconds: float) -> tuple[int, float, float]:
    """Sleep; return this process's id, and when the sleep began and ended."""
    start = time.time()
    time.sleep(seconds)  # holds the lease while the other leases start theirs
    return os.getpid(), start, time.time()


def huge(n_bytes: int) -> bytes:
    """An output of `n_bytes` bytes."""
    return b"x" * n_bytes


@pytest.mark.timeout(60)
async def test_output_over_the_frame_limit_fails_at_once_and_frees_the_slice(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node, and a function allowed 1 GiB of output whose chunk deadline is 60 s
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    n_bytes = 300 * 2**20
    job = Job(huge, [n_bytes], max_output_bytes=2**30, timeout_s=60, retry=NO_RETRY)
    # When its chunk returns 300 MiB
    t0 = time.monotonic()
    result = await fabric.run(job, Gather(), slices=1, timeout_s=30)
    # Then it failed at once, permanently, naming the limit and the size
    (failure,) = result.failures
    assert time.monotonic() - t0 < 20
    assert failure.error_kind is ErrorKind.LAUNCH_FAILED and failure.attempt == 1
    size = re.search(
        r"output of (\d+) bytes exceeds .* (\d+) bytes \(the executor frame limit",
        failure.error or "",
    )
    assert size is not None, failure.error
    assert int(size[1]) >= n_bytes and int(size[2]) == MAX_OUTPUT_BYTES
    # And the fleet shows no VRAM leased right after
    await eventually(lambda: _leased(fabric) == 0, timeout_s=3)


# Imports in the worker; in its executors (which never get the worker's environment) it
# hangs, as an executor that cannot start (no permission on the interpreter, say) never
# says it is ready.
_STUCK_MODULE = """
import os, time
KERNELS = ()
if "VF_TEST_IN_WORKER" not in os.environ:
    while True:
        time.sleep(1)  # the hang under test
"""


@pytest.mark.timeout(60)
def test_worker_whose_executors_cannot_start_is_never_ready_and_stops_on_sigterm(
    broker: BrokerSettings,
) -> None:
    # Given a worker whose executors hang at start (the module dir is readable by all uids)
    folder = Path(tempfile.mkdtemp(prefix="vf-stuck-"))
    folder.chmod(0o755)
    (folder / "vf_stuck_kernels.py").write_text(_STUCK_MODULE)
    (folder / "vf_stuck_kernels.py").chmod(0o644)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, (str(folder), os.environ.get("PYTHONPATH")))),
        VF_TEST_IN_WORKER="1",
        VRAMFABRIC_NATS_URL=broker.url,
        VRAMFABRIC_PREFIX=broker.prefix,
        VRAMFABRIC_DRAIN_GRACE_S="2",
    )
    from vramfabric.broker.server import die_with_parent

    args = ["--simulate", "1x4GiB", "--node", "stuck", "--kernel-module", "vf_stuck_kernels"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramfabric.worker", "-v", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=die_with_parent,
    )
    try:
        # When its first executor has been started (and hangs, never saying ready)
        assert poll_until(lambda: executor_children(proc.pid) > 0, timeout_s=30)
        assert proc.poll() is None
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # Then it exits within its drain grace plus a few seconds, never having said ready
        code = proc.wait(15)
        assert time.monotonic() - t0 < 2 + 5 + 1, time.monotonic() - t0
        out = proc.stdout.read() if proc.stdout else b""
        assert b"worker ready" not in out
        assert code == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
