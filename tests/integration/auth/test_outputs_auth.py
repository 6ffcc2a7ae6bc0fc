"""Auth on: outputs through the outputs store, and stored results, as a tenant reads them."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.helpers import eventually
from vramfabric.coordinator import Job
from vramfabric.coordinator.aggregate import Gather


def numbered_bytes(spec: tuple[int, int]) -> bytes:
    """`size` bytes that differ per chunk `index` (a swapped or missing chunk shows)."""
    index, size = spec
    pattern = index.to_bytes(4, "little") * 251
    return (pattern * (size // len(pattern) + 1))[:size]


async def test_several_outputs_of_300_kib_come_back_whole_at_once(
    agents: Any, fabrics: Any
) -> None:
    # Given a node of 6 slices that stores outputs over 16 bytes in the tenant's outputs store
    await agents("n-big", simulate="1x6GiB", inline_output_bytes=16, allow_code=True)
    alice = await fabrics("alice")
    await eventually(lambda: bool(alice.fleet.adverts))
    # When alice runs jobs of 6 chunks of 300 KiB outputs each, read back at once
    specs = [(i, 300 * 2**10) for i in range(6)]
    for _ in range(3):
        done = await alice.run(Job(numbered_bytes, specs), Gather(), slices=6, timeout_s=60)
        # Then every output comes back whole, on the first read
        assert done.ok, [f.error for f in done.failures]
        assert done.value == [numbered_bytes(s) for s in specs]


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_stored_job_of_20000_results_replays_with_auth_on_without_stalls(
    agents: Any, fabrics: Any
) -> None:
    # Given a job of 20,000 tiny chunks, one result message each, whose results are stored
    # (enough for the server to ask the tenant's follower for flow-control replies)
    await agents("n-replay", simulate="1x2GiB", allow_code=True)
    alice = await fabrics("alice")
    await eventually(lambda: bool(alice.fleet.adverts))
    job = Job(abs, list(range(20_000)), job_id="replay-auth", chunks_per_message=1)
    first = await alice.run(job, Gather(), timeout_s=200)
    assert first.ok
    # When the same job runs again (every result read back from the stream, nothing run)
    t0 = time.monotonic()
    again = await alice.run(job, Gather(), timeout_s=200)
    replay_s = time.monotonic() - t0
    # Then it folds every stored result without flow-control stalls (33.6 s against 1.1 s
    # with auth off before the tenant could answer them, 10 s a stall)
    assert again.ok and again.value == list(range(20_000))
    assert replay_s < 8.0, replay_s
