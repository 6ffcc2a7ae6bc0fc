"""A coordinator process for the coordinator-kill chaos scenario (run with `python -m`).

Arguments: URL PREFIX REPLICAS N JOB_ID LOG_DIR. It runs the harness's job until killed.
"""

from __future__ import annotations

import asyncio
import sys

from tests.chaos.harness import NODE_TTL_S, SLICES, chaos_job, chaos_settings, count_each
from vramfabric.broker import BrokerSettings
from vramfabric.coordinator import Fabric


async def main(url: str, prefix: str, replicas: int, n: int, job_id: str, log_dir: str) -> None:
    """Run the job (the test kills this process part-way)."""
    broker = BrokerSettings(url=url, prefix=prefix, replicas=replicas, node_ttl_s=NODE_TTL_S)
    async with await Fabric.connect(broker, chaos_settings()) as fabric:
        await fabric.run(chaos_job(n, log_dir, job_id), count_each(), slices=SLICES)


if __name__ == "__main__":
    url, prefix, replicas, n, job_id, log_dir = sys.argv[1:7]
    asyncio.run(main(url, prefix, int(replicas), int(n), job_id, log_dir))
