"""Jobs at the shapes researchers bring: chunks of a minute, outputs of 100 MiB, reruns.

Each runs after an earlier job, so the tenant's results stream already holds other jobs'
results (the follower of a new job sees its stream position move with nothing for it).
"""

from __future__ import annotations

import hashlib
import time

import pytest

from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.coordinator import Fabric, Gather, Job
from vramfabric.coordinator.jobs.lifecycle import remove

pytestmark = pytest.mark.slow

MIB = 2**20


def slow_square(spec: tuple[int, float]) -> int:
    """Square `value` after `seconds` (a training loop that long, standing in)."""
    value, seconds = spec
    time.sleep(seconds)  # stands in for a chunk that computes this long
    return value * value


def big_output(spec: tuple[int, int]) -> bytes:
    """`size` bytes that differ per chunk `index` and along the output (a moved chunk shows)."""
    index, size = spec
    block = hashlib.sha256(index.to_bytes(4, "little")).digest() * 2048  # 64 KiB
    out = bytearray(block * (size // len(block) + 1))[:size]
    out[:: 1 << 20] = bytes([index & 0xFF]) * len(out[:: 1 << 20])
    return bytes(out)


async def earlier_job(fabric: Fabric) -> None:
    """Run a small job, so the results stream holds results that are not the next job's."""
    done = await fabric.run(Job(abs, list(range(-200, 0))), Gather(), timeout_s=60)
    assert done.ok


@pytest.mark.timeout(300)
async def test_two_chunks_of_50_s_after_an_earlier_job_succeed(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a tenant whose results stream holds an earlier job's results
    await agent_factory("n1", simulate="1x2GiB", allow_code=True)
    fabric = await fabric_factory()
    await earlier_job(fabric)
    # When a job of 2 chunks that each run 50 s runs (no result for 50 s)
    t0 = time.monotonic()
    done = await fabric.run(Job(slow_square, [(3, 50.0), (4, 50.0)]), Gather(), timeout_s=240)
    # Then it finishes with both results (it died of FollowerStalled at 40 s before)
    assert done.ok, [f.error for f in done.failures]
    assert done.value == [9, 16]
    assert time.monotonic() - t0 >= 50.0


@pytest.mark.timeout(300)
async def test_two_outputs_of_100_mib_come_back_byte_exact(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a tenant whose results stream holds an earlier job's results
    await agent_factory("n1", simulate="1x2GiB", allow_code=True)
    fabric = await fabric_factory()
    await earlier_job(fabric)
    # When a job returns two outputs of 100 MiB each
    specs = [(1, 100 * MIB), (2, 100 * MIB)]
    job = Job(big_output, specs, max_output_bytes=128 * MIB)
    done = await fabric.run(job, Gather(), timeout_s=240)
    # Then both come back whole, byte for byte
    assert done.ok, [f.error for f in done.failures]
    assert [hashlib.sha256(v).hexdigest() for v in done.value] == [
        hashlib.sha256(big_output(s)).hexdigest() for s in specs
    ]


async def test_a_removed_job_runs_again_at_once(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a job of 1,000 chunks that ran, then was removed (`vramfabric rm`), all inside
    # the work stream's 2-minute window for duplicate ids
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    job = Job(abs, list(range(-1000, 0)), job_id="again")
    first = await fabric.run(job, Gather(), timeout_s=60)
    assert first.ok
    await remove(fabric.conn, fabric.broker, fabric.settings.tenant, "again")
    # When the same job (same id, same chunk ids) runs again
    again = await fabric.run(job, Gather(), timeout_s=60)
    # Then every chunk runs again (966 of 1,000 before: the rest were taken for duplicates
    # of the removed messages and never queued, and the job waited for ever)
    assert again.ok and again.n_ok == 1000
    assert again.value == list(range(1000, 0, -1))
