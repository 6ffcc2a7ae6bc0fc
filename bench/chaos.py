"""Chaos matrix: run each fault scenario R times; one JSON line per scenario.

    python bench/chaos.py                      # 20 runs of worker_kill, 5 of the others
    python bench/chaos.py --scenario server_kill --runs 2
    python bench/chaos.py --auth               # the same with a generated tenants config

Each run is a fresh fabric of real processes (nats-server or a 3-server cluster, 4 worker
processes) and one 1000-chunk job; see tests/chaos/harness.py for what each fault does.
Run it from the repository root (it imports the harness from tests/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.getcwd())

from tests.chaos.harness import SCENARIOS, Outcome, run_scenario

DEFAULT_RUNS = {"worker_kill": 20}


def summarise(scenario: str, outcomes: list[Outcome]) -> dict[str, object]:
    """One JSON-ready line for a scenario's runs."""
    return {
        "bench": "chaos",
        "scenario": scenario,
        "auth": outcomes[0].auth if outcomes else False,
        "runs": len(outcomes),
        "chunks_per_run": outcomes[0].chunks if outcomes else 0,
        "jobs_completed": sum(o.completed for o in outcomes),
        "chunks_lost": sum(o.lost for o in outcomes),
        "chunks_aggregated_twice": sum(o.aggregated_twice for o in outcomes),
        "re_executions_total": sum(o.re_executions for o in outcomes),
        "re_executions_max": max((o.re_executions for o in outcomes), default=0),
        "in_flight_bound": max((o.in_flight_at_fault for o in outcomes), default=0),
        "longest_stall_s": max((o.longest_stall_s for o in outcomes), default=0.0),
        "stalls_s": [o.longest_stall_s for o in outcomes],
        "lease_cleanup_s_max": max((o.lease_cleanup_s for o in outcomes), default=0.0),
        "lease_bound_s": outcomes[0].lease_bound_s if outcomes else 0.0,
        "errors": [o.error for o in outcomes if o.error],
        "machine": f"{platform.machine()} {os.cpu_count()} cores "
        f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
    }


async def main(scenarios: list[str], runs: int | None, n: int, with_auth: bool) -> None:
    """Run the matrix, printing each scenario's line as soon as it is done."""
    for scenario in scenarios:
        count = runs or DEFAULT_RUNS.get(scenario, 5)
        outcomes = [
            await run_scenario(scenario, n=n, seed=i, with_auth=with_auth) for i in range(count)
        ]
        print(json.dumps(summarise(scenario, outcomes)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", action="append", choices=SCENARIOS)
    parser.add_argument(
        "--runs", type=int, help="runs per scenario (default 20 worker_kill, 5 others)"
    )
    parser.add_argument("--n", type=int, default=1000, help="chunks per job")
    parser.add_argument(
        "--auth", action="store_true", help="servers run a generated tenants config (auth on)"
    )
    args = parser.parse_args()
    asyncio.run(main(args.scenario or list(SCENARIOS), args.runs, args.n, args.auth))
