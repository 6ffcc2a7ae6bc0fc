"""A coordinator process for the coordinator-kill chaos scenario (run with `python -m`).

Arguments: N JOB_ID LOG_DIR. The server, prefix, replicas, node TTL, tenant and any
credentials come from the `VRAMFABRIC_*` environment. It runs the harness's job until killed.
"""

from __future__ import annotations

import asyncio
import sys

from tests.chaos.harness import SLICES, chaos_job, chaos_settings, count_each
from vramfabric.broker import BrokerSettings
from vramfabric.coordinator import CoordinatorSettings, Fabric


async def main(n: int, job_id: str, log_dir: str) -> None:
    """Run the job (the test kills this process part-way)."""
    tenant = CoordinatorSettings.from_env().tenant
    async with await Fabric.connect(BrokerSettings.from_env(), chaos_settings(tenant)) as fabric:
        await fabric.run(chaos_job(n, log_dir, job_id), count_each(), slices=SLICES)


if __name__ == "__main__":
    n, job_id, log_dir = sys.argv[1:4]
    asyncio.run(main(int(n), job_id, log_dir))
