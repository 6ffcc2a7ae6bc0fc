"""`vramfabric run`: a JOB.toml against a running fabric, with progress, metrics and a plot.

`--detach` hands the run to a coordinator process of its own (detach.py). Every run stores
the job's origin (the job file's absolute path) first, so that a job whose coordinator is
gone can be resumed from another process (`Fabric.job(ID).result()`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any, TypeVar

import attrs

from vramfabric.broker.jobdriver import JobOrigin
from vramfabric.broker.server import host_port
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator.api.fabric import Fabric, JobResult
from vramfabric.coordinator.jobs.driver import write_origin
from vramfabric.coordinator.jobs.jobfile import JobFile
from vramfabric.coordinator.metrics import CoordinatorMetrics
from vramfabric.coordinator.run.results import Progress, ResultsConsumer
from vramfabric.coordinator.settings import CoordinatorSettings

from .exits import (
    RET_FAILED,
    RET_INTERRUPTED,
    RET_JOB_FAILED,
    RET_NO_NODES,
    RET_OK,
    RET_USAGE,
)
from .report import (
    err,
    jsonable,
    print_run,
    progress_bar,
    report,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long `run` waits for a first advert before it says that no node is advertising.
NO_NODES_HINT_S = 5.0


def cmd_run(args: argparse.Namespace) -> int:
    """Run a JOB.toml against a running fabric."""
    from vramfabric.coordinator.jobs.jobfile import load

    try:
        spec = load(args.jobfile)
        # Every input encoded and checked against the kernel's limits before anything is
        # leased; the id is the one a rerun resumes.
        job_id = spec.job.spec(CoordinatorSettings.from_env()).job_id
    except (ValueError, TypeError, ImportError) as exc:
        err.print(f"vramfabric run: {exc}")
        return RET_USAGE
    if args.plot and (problem := plot_problem(args.plot)):
        err.print(f"vramfabric run: {problem}")
        return RET_USAGE
    if args.log and not args.detach:
        err.print("vramfabric run: --log is where a detached coordinator logs: add --detach")
        return RET_USAGE
    if args.detach:
        from .detach import detach

        return detach(args, job_id)
    seen = _Seen(spec.job.size or 0)
    try:
        with progress_bar(not args.json, seen.total) as progress:
            result = asyncio.run(_run(spec, seen.watching(progress), args, job_id))
        if result is None:
            return RET_NO_NODES
    except KeyboardInterrupt:
        err.print(
            f"vramfabric run: interrupted: job {job_id} has {seen.done}/{seen.total} chunks "
            f"done ({seen.failed} failed); its chunks stay queued: run the same command again "
            "to resume it (the job id is the hash of the job file's spec), or "
            f"`vramfabric cancel {job_id}` to drop them"
        )
        return RET_INTERRUPTED
    summary = report(result)
    if args.json:
        print(json.dumps(summary, default=jsonable), flush=True)
    else:
        print_run(summary)
    plotted = plot(result.series, args.plot) if args.plot else True
    return (RET_OK if plotted else RET_FAILED) if result.ok else RET_JOB_FAILED


@attrs.define
class _Seen:
    """The last progress a run reported, kept for the line an interrupted run prints."""

    total: int
    done: int = 0
    failed: int = 0

    def watching(self, bar: Progress | None) -> Progress:
        """A progress callback that records the counts, then updates `bar` if any."""

        def update(results: ResultsConsumer) -> None:
            self.done, self.failed = results.n_done, results.n_failed
            if bar is not None:
                bar(results)

        return update


def serve_metrics(metrics: CoordinatorMetrics, port: int, addr: str) -> None:
    """Serve the coordinator's metrics for the life of this process and say where."""
    try:
        port = metrics.serve(port, addr)
    except OSError as exc:
        raise ValueError(f"metrics port {port}: {exc}") from exc
    err.print(f"metrics: http://{host_port(addr, port)}/metrics")  # IPv6 in brackets


async def _run(
    spec: JobFile, progress: Any, args: argparse.Namespace, job_id: str
) -> JobResult | None:
    settings, metrics = CoordinatorSettings.from_env(), CoordinatorMetrics()
    if args.metrics_port is not None:
        serve_metrics(metrics, args.metrics_port, settings.metrics_addr)
    broker = BrokerSettings.from_env()
    async with await Fabric.connect(broker, settings, metrics) as fabric:
        path = str(Path(args.jobfile).resolve())
        origin = JobOrigin(job_id, path, socket.gethostname(), args.logged_to or "")
        await write_origin(fabric.conn, broker, settings.tenant, origin)
        running = asyncio.ensure_future(
            fabric.run(
                spec.job,
                spec.aggregator,
                slices=spec.slices,
                progress=progress,
                timeout_s=args.timeout_s,
                retry_failed=args.retry_failed,
            )
        )
        watch = asyncio.ensure_future(_watch_nodes(fabric, broker, running, args.no_wait))
        try:
            return await running
        except asyncio.CancelledError:
            if watch.done() and not watch.cancelled() and watch.result():
                return None  # stopped by the watch: no node (--no-wait)
            raise
        finally:
            watch.cancel()
            if not running.done():
                running.cancel()
            await asyncio.wait({watch, running})


async def _watch_nodes(
    fabric: Fabric, broker: BrokerSettings, running: asyncio.Future[Any], no_wait: bool
) -> bool:
    """Say so when no node advertises a few seconds in, and again when one does.

    With `no_wait` the run is stopped instead; True then.
    """
    await asyncio.sleep(NO_NODES_HINT_S)
    if fabric.fleet.adverts:
        return False
    what = (
        f"vramfabric run: no node is advertising on {broker.url} (prefix {broker.prefix}) "
        f"after {NO_NODES_HINT_S:.0f}s; start workers with `vramfabric worker --simulate "
        "4x48GiB` (or `vramfabric up`) on this URL and prefix"
    )
    if no_wait:
        err.print(f"{what}, then run the same command again (--no-wait: not waiting)")
        running.cancel()
        return True
    err.print(f"{what}; waiting for one (Ctrl-C stops, the same command resumes)")
    while not fabric.fleet.adverts:
        await fabric.fleet.wait_changed(timeout_s=1.0)
    err.print(f"vramfabric run: {len(fabric.fleet.adverts)} node(s) advertising; running")
    return False


def plot_problem(path: str) -> str | None:
    """Why `--plot PATH` could not be drawn after the run (checked before it), else None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"--plot {path}: the lease plot needs matplotlib: pip install 'vramfabric[plot]'"
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        return f"--plot {path}: folder {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"--plot {path}: folder {folder} is not writable"
    return None


def plot(series: Any, path: str) -> bool:
    """Draw the lease plot after the summary is out; a failure is reported, not raised."""
    from .plot import plot_series

    try:
        err.print(f"lease plot written to {plot_series(series, path)}")
    except (ImportError, OSError, ValueError) as exc:
        err.print(f"vramfabric: the lease plot was not written to {path}: {exc}")
        return False
    return True
