"""The multi-host run's job: its kernel (workers load this module) and its coordinator process.

The kernel logs each execution as a file named for the chunk, the network namespace it ran
in (the host) and the monotonic time it began: CLOCK_MONOTONIC is one clock for every
process on the machine, whatever namespace, so the test lines executions up with its cuts.

    python -m tests.multihost_job N LOG_DIR OUT_FILE NODES SLICES SLEEP_S

runs the job as a coordinator (settings from the `VRAMFABRIC_*` environment) once NODES
nodes advertise, and writes what it saw to OUT_FILE as JSON (see `main`).
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import sys
import time
import uuid
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import attrs
import numpy as np

from vramfabric.kernels import Kernel


def _hostlog(xp: ModuleType, args: Mapping[str, Any], data: bytes) -> bytes:
    """Log this execution (chunk, host, start time), sleep `sleep_s`, return float32(value)."""
    (value,) = struct.unpack("<i", data)
    netns = os.stat("/proc/self/ns/net").st_ino
    name = f"{value}-{netns}-{time.monotonic_ns()}-{uuid.uuid4().hex[:8]}"
    with open(os.path.join(str(args["log_dir"]), name), "w"):
        pass
    time.sleep(float(args["sleep_s"]))  # stands in for a short GPU kernel
    return np.float32(value).tobytes()


HOSTLOG = Kernel(name="hostlog", reference=_hostlog, max_input_bytes=4, max_output_bytes=4)
KERNELS = (HOSTLOG,)


@attrs.frozen
class Execution:
    """One execution of a chunk: which, in which network namespace (inode), begun when."""

    index: int
    netns: int
    start_s: float


def executions(log_dir: str) -> list[Execution]:
    """Every execution logged so far, in the order they began."""
    runs = []
    for name in os.listdir(log_dir):
        index, netns, start_ns, _ = name.split("-")
        runs.append(Execution(int(index), int(netns), int(start_ns) / 1e9))
    return sorted(runs, key=lambda e: e.start_s)


async def main(
    n: int, log_dir: str, out_file: str, nodes: int, slices: int, sleep_s: float
) -> None:
    """Run the job once `nodes` nodes advertise; write folds, times and the outcome as JSON.

    The JSON holds `n_ok`, `n_failed`, `folded` (how often each chunk index was folded, by
    index), `fold_at` (when each index was first folded, monotonic seconds), `server` (the
    URL this coordinator was connected to when the job began) and `error`.
    """
    from vramfabric.broker import BrokerSettings, RetryPolicy
    from vramfabric.coordinator import CoordinatorSettings, Fabric, Fold, Job

    folded: dict[int, int] = {}
    fold_at: dict[int, float] = {}

    def fold(state: None, index: int, _output: bytes) -> None:
        folded[index] = folded.get(index, 0) + 1
        fold_at.setdefault(index, time.monotonic())

    report: dict[str, Any] = {"n_ok": 0, "n_failed": 0, "error": "", "server": ""}
    settings = CoordinatorSettings(
        slice_bytes=256 * 2**20, lease_ttl_s=3.0, ack_wait_s=2.0, max_slices=slices
    )
    try:
        async with await Fabric.connect(BrokerSettings.from_env(), settings) as fabric:
            while len(fabric.fleet.adverts) < nodes:
                await fabric.fleet.wait_changed(timeout_s=1.0)
            url = fabric.conn.nc.connected_url
            report["server"] = url.geturl() if url else ""
            print(f"job started at={time.monotonic():.6f} server={report['server']}", flush=True)
            job = Job(
                HOSTLOG,
                [struct.pack("<i", i) for i in range(n)],
                args={"sleep_s": sleep_s, "log_dir": log_dir},
                retry=RetryPolicy(max_retries=20, initial_backoff_s=0.1, max_backoff_s=1.0),
                chunks_per_message=1,  # one chunk a message: each lease holds one at a time
            )
            result = await fabric.run(job, Fold(fold), slices=slices, timeout_s=150)
            report.update(n_ok=result.n_ok, n_failed=result.n_failed)
    except Exception as exc:  # recorded: the test reports it with what was folded
        report["error"] = f"{type(exc).__name__}: {exc}"
    report.update(folded=folded, fold_at=fold_at)
    with open(out_file, "w") as out:
        json.dump(report, out)


if __name__ == "__main__":
    n, log_dir, out_file, nodes, slices, sleep_s = sys.argv[1:7]
    asyncio.run(main(int(n), log_dir, out_file, int(nodes), int(slices), float(sleep_s)))
