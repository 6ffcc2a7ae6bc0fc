"""The demo: a built-in CUDA kernel's pattern on simulated workers of an embedded fabric.

The default is the 1000-configuration hyperparameter search: the registered built-in
`hyperparam_eval`, whose CUDA source (hyperparam.cu) the workers run on their host path
without --allow-code (it is the project's own code, named by the job, never sent: see
docs/kernels.md). `--kernel` picks another pattern (Monte Carlo, inference, image tiles,
fitness, defined in demo_patterns.py): a CudaKernel the job uploads, so its workers run with
--allow-code. Each answer is checked against the kernel's NumPy reference run directly,
with no fabric involved.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from vramfabric.broker.settings import parse_size
from vramfabric.coordinator.aggregate import ArgMin
from vramfabric.coordinator.api.fabric import Fabric, JobResult
from vramfabric.coordinator.jobs.job import Job
from vramfabric.coordinator.metrics import CoordinatorMetrics
from vramfabric.coordinator.run.results import Progress
from vramfabric.coordinator.settings import CoordinatorSettings
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.host_build import COMPILER
from vramfabric.kernels.hyperparam import encode_config, search_space

from .demo_patterns import CHUNKS, PATTERNS, Pattern
from .local import LocalFleet, demo_tenants_file

T = TypeVar("T")

# The demo's tenant (the default tenant when auth is off).
TENANT = "demo"
KERNELS = ("hyperparam", "montecarlo", "inference", "tiles", "fitness")
# The host path's float32 sums run in another order than NumPy's (measured: 2.3e-7 at most
# over the 1000 configurations; tests/unit/test_cuda_host.py).
HYPERPARAM_RTOL = 2e-6


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
    kernel: str = "hyperparam",
) -> dict[str, Any]:
    """Start an embedded fabric, run `kernel`'s pattern, stop everything; return the summary.

    `metrics` is the coordinator's registry; workers serve theirs on `workers_metrics_port`
    plus their index (each on a free port if 0) when it is set. `with_auth` runs the server
    with a generated tenants file (fresh passwords): the search then runs as tenant `demo`
    through the permissions of a real deployment. The server listens on `port` (-1: a free
    one); nothing else is shared with another fabric on this machine (temp store, no
    discovery file), so demos run side by side. `n_configs` sizes the hyperparameter search
    only; the other patterns have fixed sizes (`demo_chunks`).
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown demo kernel {kernel!r}; expected one of {', '.join(KERNELS)}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vramfabric-demo-") as folder:
        # A pattern's CudaKernel is the tenant's code on simulated GPUs; the search is not.
        path = Path(folder) / "tenants.toml"
        code = kernel != "hyperparam"
        tenants_file = str(demo_tenants_file(path, allow_code=code)) if with_auth else None
        fleet = LocalFleet(
            workers=workers,
            simulate=simulate,
            slice_size=slice_size,
            verbose=verbose,
            metrics_port=workers_metrics_port,
            tenants_file=tenants_file,
            port=port,
            # An uploaded CudaKernel's source runs natively on simulated GPUs: code, as a
            # function is. The default search runs a registered kernel: no code is sent.
            worker_args=("--allow-code",) if kernel != "hyperparam" else (),
        )
        if kernel != "hyperparam":
            return _pattern_demo(fleet, PATTERNS[kernel](), slice_size, progress, t0, metrics)
        return _demo(fleet, n_configs, slice_size, progress, t0, metrics)


def _on_fleet(
    fleet: LocalFleet, t0: float, run: Callable[[], Coroutine[Any, Any, T]]
) -> tuple[float, list[int], T]:
    """Start the fleet, run `run()` on it, stop it: (seconds to start, exit codes, result)."""
    fleet.start()
    try:
        started_s = time.perf_counter() - t0
        outcome = asyncio.run(run())
    finally:
        exit_codes = fleet.stop()
    return started_s, exit_codes, outcome


def _demo(
    fleet: LocalFleet,
    n_configs: int,
    slice_size: str,
    progress: Progress | None,
    t0: float,
    metrics: CoordinatorMetrics | None,
) -> dict[str, Any]:
    started_s, exit_codes, (result, leased_after) = _on_fleet(
        fleet, t0, lambda: run_search(fleet, n_configs, parse_size(slice_size), progress, metrics)
    )
    configs = search_space(n_configs)
    expected_index, expected_loss = reference_argmin(configs)
    best = result.value
    job_s = result.phases_s["total_s"]
    summary: dict[str, Any] = {
        "kernel": "hyperparam",
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
            best
            and best[0] == expected_index
            and math.isclose(best[1], expected_loss, rel_tol=HYPERPARAM_RTOL)
        ),
        # What the workers ran: hyperparam.cu on the host path, or (no g++ here) its reference.
        "ran": "cuda source on the host path" if shutil.which(COMPILER) else "numpy reference",
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


def demo_chunks(kernel: str, n_configs: int) -> int:
    """How many chunks the demo of `kernel` runs (for a progress bar)."""
    if kernel == "hyperparam":
        return n_configs
    return CHUNKS[kernel]


async def run_pattern(
    fleet: LocalFleet,
    pattern: Pattern,
    slice_bytes: int,
    progress: Progress | None,
    metrics: CoordinatorMetrics | None = None,
) -> tuple[JobResult, int]:
    """Run a pattern's job on a started fleet; return the result and the VRAM left leased."""
    n = len(pattern.inputs)
    settings = CoordinatorSettings(slice_bytes=slice_bytes, max_slices=n, tenant=TENANT)
    async with await Fabric.connect(fleet.broker_for(TENANT), settings, metrics) as fabric:
        job = Job(pattern.kernel, pattern.inputs)
        result = await fabric.run(job, pattern.aggregator(), slices=n, progress=progress)
        return result, await leased_bytes_settle(fabric)


def _pattern_demo(
    fleet: LocalFleet,
    pattern: Pattern,
    slice_size: str,
    progress: Progress | None,
    t0: float,
    metrics: CoordinatorMetrics | None,
) -> dict[str, Any]:
    started_s, exit_codes, (result, leased_after) = _on_fleet(
        fleet, t0, lambda: run_pattern(fleet, pattern, parse_size(slice_size), progress, metrics)
    )
    matches, answer = pattern.check(result.value) if result.n_ok else (False, "no result")
    job_s = result.phases_s["total_s"]
    return {
        "kernel": pattern.name,
        "chunks": len(pattern.inputs),
        "ok": result.n_ok,
        "failed": result.n_failed,
        "answer": answer,
        "matches_reference": bool(matches),
        "leases_peak": result.leases_peak,
        "job_s": round(job_s, 4),
        "chunks_per_s": round(len(pattern.inputs) / job_s, 1),
        "phases_s": {k: round(v, 4) for k, v in result.phases_s.items()},
        "startup_s": round(started_s, 3),
        "leased_bytes_after": leased_after,
        "worker_exit_codes": exit_codes,
        "series": [list(p) for p in result.series],
        "auth": fleet.tenants_file is not None,
    }


def print_pattern(s: dict[str, Any]) -> None:
    """A pattern demo's summary as text (the hyperparameter search has report.print_demo)."""
    verdict = "matches" if s["matches_reference"] else "DOES NOT MATCH"
    print(f"{s['kernel']}: {s['answer']}")
    print(f"({verdict} the kernel's NumPy reference run directly)")
    print(f"chunks: {s['ok']} ok, {s['failed']} failed of {s['chunks']}")
    print(
        f"job: {s['job_s']} s ({s['chunks_per_s']} chunks/s), {s['leases_peak']} leases at peak, "
        f"fabric started in {s['startup_s']} s; VRAM leased after: {s['leased_bytes_after']} bytes"
    )
