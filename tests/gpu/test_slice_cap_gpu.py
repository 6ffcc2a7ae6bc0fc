"""The GPU path of an executor: per lease one stream and one CuPy pool capped at its slice.

The pool and stream are kept for the lease's life (not rebuilt per chunk) and freed when the
agent says the lease ended; an allocation past the slice fails that chunk only, as
`vram_exceeded` naming the size asked for, and the lease's next chunk runs.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from vramfabric.broker.errors import ErrorKind
from vramfabric.kernels import builtin_registry
from vramfabric.kernels.code import Context, PythonCode, encode_input
from vramfabric.worker.executor import ipc
from vramfabric.worker.executor.work_runner import Failure, WorkRunner

MIB = 2**20
SLICE_BYTES = 64 * MIB


def allocate(n_bytes: int, ctx: Any) -> int:
    """Allocate `n_bytes` on the chunk's device (through the lease's pool) and touch them."""
    x = ctx.xp.ones(n_bytes, dtype=ctx.xp.uint8)
    return int(x.sum())


@pytest.fixture
def runner() -> tuple[WorkRunner, PythonCode]:
    runner = WorkRunner(builtin_registry, simulated=False)
    code = PythonCode.of(allocate)
    runner.add_blob(code.digest, code.to_blob())
    return runner, code


def run(cupy: ModuleType, runner: WorkRunner, code: PythonCode, lease: str, n_bytes: int) -> bytes:
    frame = ipc.Run(
        kind="python",
        digest=code.digest,
        input=encode_input(n_bytes),
        slice_bytes=SLICE_BYTES,
        lease=lease,
        job="j",
        index=0,
        attempt=1,
    )
    ctx = Context(device=0, slice_bytes=SLICE_BYTES, xp=cupy, attempt=1, job="j", index=0)
    return runner.execute(frame, ctx)


def test_an_allocation_past_the_slice_fails_that_chunk_only(
    cupy: ModuleType, runner: tuple[WorkRunner, PythonCode]
) -> None:
    work, code = runner
    assert run(cupy, work, code, "a", 16 * MIB)
    # When a chunk asks for twice its slice
    with pytest.raises(Failure) as info:
        run(cupy, work, code, "a", 2 * SLICE_BYTES)
    # Then it fails as vram_exceeded, naming the limit and what it asked for
    assert info.value.kind is ErrorKind.VRAM_EXCEEDED
    assert f"limit_bytes={SLICE_BYTES} requested_bytes={2 * SLICE_BYTES}" in str(info.value)
    # And the lease's next chunk runs, as does another lease's
    assert run(cupy, work, code, "a", 16 * MIB)
    assert run(cupy, work, code, "b", 48 * MIB)


def test_each_lease_has_a_cap_of_its_own(
    cupy: ModuleType, runner: tuple[WorkRunner, PythonCode]
) -> None:
    work, code = runner
    # 48 MiB twice would not fit one 64 MiB cap: two leases, two pools
    for lease in ("a", "b"):
        assert run(cupy, work, code, lease, 48 * MIB)
    assert work.devices is not None and len(work.devices) == 2


def test_a_leases_stream_and_pool_live_until_the_lease_ends(
    cupy: ModuleType, runner: tuple[WorkRunner, PythonCode]
) -> None:
    work, code = runner
    devices = work.devices
    assert devices is not None
    run(cupy, work, code, "a", 8 * MIB)
    first = devices._leases["a"]
    # The pool keeps the freed block for the lease's next chunk: nothing is allocated again
    assert first.pool.total_bytes() >= 8 * MIB
    run(cupy, work, code, "a", 8 * MIB)
    assert devices._leases["a"] is first
    # When the agent says the lease ended, Then its pool's memory goes back to the GPU
    work.end_lease("a")
    assert len(devices) == 0 and first.pool.total_bytes() == 0


def test_a_lease_that_ends_while_its_chunk_runs_is_freed_after_it(cupy: ModuleType) -> None:
    runner = WorkRunner(builtin_registry, simulated=False)
    devices = runner.devices
    assert devices is not None
    with cupy.cuda.Device(0), devices.using("a", SLICE_BYTES) as device:
        runner.end_lease("a")
        assert len(devices) == 1  # its chunk still runs on it
        assert device.pool.get_limit() == SLICE_BYTES
    assert len(devices) == 0
