"""A fabric across hosts with TLS: stalls and re-executions when hosts are cut off.

    python bench/multihost.py                       # one run; one JSON line
    python bench/multihost.py --runs 3 --server-cut other

Each run makes 8 hosts (network namespaces on a bridge: 3 servers, 4 workers, a
coordinator; needs root on Linux), runs a 3,000-chunk job, cuts the first worker's host off
for 5 s and then a server's host for 8 s (by default the one the coordinator is connected
to), and prints the stall at each cut, the re-executions and the total time; see
tests/multihost.py for what each figure means. Run it from the repository root (it imports
the setup from tests/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())

from tests import netns
from tests.multihost import MultiHost, N, run
from tests.multihost_outcome import Outcome, as_json


def one_run(n: int, server_cut: str) -> Outcome:
    """Set the hosts up, run the job with its cuts, and remove everything."""
    with tempfile.TemporaryDirectory(prefix="vf-multihost-") as folder:
        mh = MultiHost(Path(folder))
        try:
            mh.start()
            return run(mh, n, server_cut)
        finally:
            mh.stop()


def summary(outcome: Outcome, setup_s: float) -> dict[str, object]:
    """One JSON-ready line for a run."""
    line: dict[str, object] = {"bench": "multihost"}
    line.update(as_json(outcome))
    line.update(
        setup_and_run_s=round(setup_s, 1),
        machine=f"{platform.machine()} {os.cpu_count()} cores Python {platform.python_version()}",
        load_1m=round(os.getloadavg()[0], 1),
        date=time.strftime("%Y-%m-%d"),
    )
    return line


def main() -> int:
    """Parse the flags, run, print one line per run; 1 if a run broke a promise."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--n", type=int, default=N, help=f"chunks per job (default {N})")
    parser.add_argument(
        "--server-cut",
        choices=("coordinator", "other"),
        default="coordinator",
        help="cut the server the coordinator is connected to, or another",
    )
    args = parser.parse_args()
    if (why := netns.unavailable()) is not None:
        print(f"bench/multihost.py: {why}", file=sys.stderr)
        return 2
    broken = False
    for _ in range(args.runs):
        t0 = time.monotonic()
        outcome = one_run(args.n, args.server_cut)
        print(json.dumps(summary(outcome, time.monotonic() - t0)), flush=True)
        broken |= bool(outcome.error or outcome.lost or outcome.aggregated_twice)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
