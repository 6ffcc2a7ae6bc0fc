"""The demo: 1000 hyperparameter configurations on simulated workers of an embedded fabric."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from vramfabric.broker.settings import parse_size
from vramfabric.coordinator.aggregate import ArgMin
from vramfabric.coordinator.fabric import Fabric, JobResult
from vramfabric.coordinator.jobs import Job
from vramfabric.coordinator.metrics import CoordinatorMetrics
from vramfabric.coordinator.results import Progress
from vramfabric.coordinator.settings import CoordinatorSettings
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space

from .local import LocalFleet, demo_tenants_file

# The demo's tenant (the default tenant when auth is off).
TENANT = "demo"


def reference_argmin(configs: list[tuple[float, int, float]]) -> tuple[int, float]:
    """The best configuration computed directly with the NumPy reference, no fabric involved."""
    losses = [
        float(np.frombuffer(HYPERPARAM_EVAL.run(np, {}, encode_config(*c)), np.float32)[0])
        for c in configs
    ]
    best = int(np.argmin(losses))  # first minimum: the same tie rule as ArgMin
    return best, losses[best]


async def leased_bytes_settle(fabric: Fabric, timeout_s: float = 5.0) -> int:
    """VRAM the adverts still show leased, polled until it reaches 0 or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        leased = sum(g.leased_bytes for a in fabric.fleet.adverts.values() for g in a.gpus)
        if leased == 0 or time.monotonic() > deadline:
            return leased
        await fabric.fleet.wait_changed(timeout_s=0.5)


async def run_search(
    fleet: LocalFleet,
    n_configs: int,
    slice_bytes: int,
    progress: Progress | None,
    metrics: CoordinatorMetrics | None = None,
) -> tuple[JobResult, int]:
    """Run the search on a started fleet; return the result and the VRAM left leased after."""
    settings = CoordinatorSettings(slice_bytes=slice_bytes, max_slices=n_configs, tenant=TENANT)
    configs = search_space(n_configs)
    async with await Fabric.connect(fleet.broker_for(TENANT), settings, metrics) as fabric:
        job = Job(HYPERPARAM_EVAL, [encode_config(*c) for c in configs])
        result = await fabric.run(job, ArgMin(), slices=n_configs, progress=progress)
        return result, await leased_bytes_settle(fabric)


def demo(
    workers: int,
    simulate: str,
    slice_size: str,
    n_configs: int,
    progress: Progress | None,
    verbose: bool = False,
    metrics: CoordinatorMetrics | None = None,
    workers_metrics_port: int | None = None,
    with_auth: bool = False,
    port: int = -1,
) -> dict[str, Any]:
    """Start an embedded fabric, run the search, stop everything; return the summary.

    `metrics` is the coordinator's registry; workers serve theirs on `workers_metrics_port`
    plus their index (each on a free port if 0) when it is set. `with_auth` runs the server
    with a generated tenants file (fresh passwords): the search then runs as tenant `demo`
    through the permissions of a real deployment. The server listens on `port` (-1: a free
    one); nothing else is shared with another fabric on this machine (temp store, no
    discovery file), so demos run side by side.
    """
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vramfabric-demo-") as folder:
        tenants_file = str(demo_tenants_file(Path(folder) / "tenants.toml")) if with_auth else None
        fleet = LocalFleet(
            workers=workers,
            simulate=simulate,
            slice_size=slice_size,
            verbose=verbose,
            metrics_port=workers_metrics_port,
            tenants_file=tenants_file,
            port=port,
        )
        return _demo(fleet, n_configs, slice_size, progress, t0, metrics)


def _demo(
    fleet: LocalFleet,
    n_configs: int,
    slice_size: str,
    progress: Progress | None,
    t0: float,
    metrics: CoordinatorMetrics | None,
) -> dict[str, Any]:
    fleet.start()
    try:
        started_s = time.perf_counter() - t0
        result, leased_after = asyncio.run(
            run_search(fleet, n_configs, parse_size(slice_size), progress, metrics)
        )
    finally:
        exit_codes = fleet.stop()
    configs = search_space(n_configs)
    expected_index, expected_loss = reference_argmin(configs)
    best = result.value
    job_s = result.phases_s["total_s"]
    summary: dict[str, Any] = {
        "configs": n_configs,
        "ok": result.n_ok,
        "failed": result.n_failed,
        "best_index": best[0] if best else None,
        "best_loss": best[1] if best else None,
        "best_config": dict(
            zip(("learning_rate", "batch_size", "dropout"), configs[best[0]], strict=True)
        )
        if best
        else None,
        "matches_reference": bool(
            best and best[0] == expected_index and np.float32(best[1]) == np.float32(expected_loss)
        ),
        "leases_peak": result.leases_peak,
        "job_s": round(job_s, 4),
        "chunks_per_s": round(n_configs / job_s, 1),
        "phases_s": {k: round(v, 4) for k, v in result.phases_s.items()},
        "startup_s": round(started_s, 3),
        "leased_bytes_after": leased_after,
        "worker_exit_codes": exit_codes,
        # (seconds, leases active, chunks done) through the run: what `--plot` draws.
        "series": [list(p) for p in result.series],
        "auth": fleet.tenants_file is not None,
    }
    return summary
