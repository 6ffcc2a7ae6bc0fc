"""Hostile payloads on every subject a worker or coordinator reads, while a real job runs."""

from __future__ import annotations

import pytest

from tests.chaos.hostile import run_flood

pytestmark = pytest.mark.timeout(180)


async def test_hostile_flood_leaves_every_process_up_and_every_job_whole() -> None:
    # When 3,000 malformed, truncated, mistyped, wrong-version and oversized messages hit
    # lease, work, result and advert subjects during a job
    verdict = await run_flood(total=3000, seed=7)
    # Then every lease request got an answer, mostly a clear error
    assert verdict["lease_unanswered"] == 0
    assert verdict["lease_error_replies"] >= 0.9 * verdict["lease_requests"]
    # And the job in progress and the next job both finished whole
    assert verdict["job_ok"] and verdict["job_after_ok"]
    # And no worker died, no lease leaked, and the rejects were counted
    assert verdict["workers_alive"] == [True, True]
    assert verdict["worker_exit_codes"] == [0, 0]
    assert verdict["leaked_lease_bytes"] == 0
    assert verdict["invalid_messages_counted"] >= verdict["lease_error_replies"]
