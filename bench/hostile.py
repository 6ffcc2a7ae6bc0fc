"""Hostile flood: N malformed messages at every subject a worker or coordinator reads.

    python bench/hostile.py              # 100,000 messages, one JSON line

Malformed, truncated, bit-flipped, mistyped, wrong-version and oversized payloads hit the
lease (acquire/renew/release), work, results and advert subjects of a fabric with two worker
processes while a 500-chunk job runs; then a second job runs. The line says whether every
process stayed up, every lease request was answered, both jobs were whole and no lease
leaked. Run it from the repository root (it imports the flood from tests/).
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

from tests.chaos.hostile import run_flood

if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100_000, help="hostile messages to send")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    verdict = asyncio.run(run_flood(total=args.n, seed=args.seed))
    verdict.update(
        bench="hostile",
        date=time.strftime("%Y-%m-%d"),
        machine=f"{platform.machine()} {os.cpu_count()} cores Python {platform.python_version()}",
    )
    print(json.dumps(verdict), flush=True)
    sys.exit(0 if verdict["passed"] else 1)
