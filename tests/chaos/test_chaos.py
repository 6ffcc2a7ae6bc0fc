"""Each failure from DESIGN.md's table, injected once into a 1000-chunk job of real processes.

bench/chaos.py runs the same scenarios many times and reports the figures.
"""

from __future__ import annotations

import pytest

from tests.chaos.harness import SCENARIOS, run_scenario

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("with_auth", [False, True], ids=["auth-off", "auth-on"])
@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_job_survives_the_fault_with_nothing_lost_or_doubled(
    scenario: str, with_auth: bool
) -> None:
    # Given a 1000-chunk job on 4 worker processes, with auth off, or on (the server runs a
    # generated tenants config, workers and coordinators connect as their own users), when
    # the fault strikes mid-job
    outcome = await run_scenario(scenario, n=1000, with_auth=with_auth)
    # Then the job completes with every chunk aggregated exactly once
    assert outcome.error == ""
    assert outcome.completed
    assert outcome.lost == 0
    assert outcome.aggregated_twice == 0
    # And no lease outlives its TTL plus one heartbeat
    assert outcome.lease_cleanup_s <= outcome.lease_bound_s
    if scenario == "coordinator_kill":
        # Only chunks in flight at the kill may run again
        assert outcome.re_executions <= outcome.in_flight_at_fault
    if scenario == "server_kill":
        # Bounded by the server's Raft election (4-9 s, not configurable) plus one second
        # for clients to notice; the goal of 5 s holds only when no leader is lost (see
        # docs/BENCHMARKS.md for the measured spread).
        assert outcome.longest_stall_s <= 10.0
    if scenario == "worker_drain":
        assert outcome.worker_exit == 0
        # A drained worker finishes what it runs: nothing needs to run twice
        assert outcome.re_executions == 0
