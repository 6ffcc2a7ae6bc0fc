"""`vramfabric`: demo, up, server, worker, run, status, job and kernel commands; one cmd_* each."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs

from vramfabric.broker import tenants
from vramfabric.broker.cluster import LocalCluster
from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection, connect
from vramfabric.broker.errors import (
    Disconnected,
    InvalidMessage,
    JobCancelled,
    JobNotFound,
    JobTimeout,
    VramfabricError,
)
from vramfabric.broker.messages import NodeAdvert
from vramfabric.broker.server import NatsServer
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import joblist, lifecycle
from vramfabric.coordinator.collect import housekeep
from vramfabric.coordinator.fabric import Fabric, JobResult
from vramfabric.coordinator.fleet import stored_adverts
from vramfabric.coordinator.jobfile import JobFile
from vramfabric.coordinator.metrics import DEFAULT_PORT as DEFAULT_METRICS_PORT
from vramfabric.coordinator.metrics import CoordinatorMetrics
from vramfabric.coordinator.results import Progress, ResultsConsumer
from vramfabric.coordinator.settings import CoordinatorSettings
from vramfabric.kernels.nvrtc import check_source
from vramfabric.kernels.settings import CudaSettings, parse_archs
from vramfabric.worker.metrics import DEFAULT_PORT as DEFAULT_WORKER_METRICS_PORT

from . import notebook
from .authserver import AuthServer
from .report import (
    err,
    jsonable,
    print_demo,
    print_job,
    print_jobs,
    print_run,
    print_status,
    progress_bar,
    report,
    status_dict,
)

RET_OK, RET_FAILED, RET_USAGE, RET_CONNECT, RET_JOB_FAILED = 0, 1, 2, 3, 4
RET_NOT_FOUND, RET_CANCELLED, RET_NO_NODES = 5, 6, 7
# As a shell reports a command stopped by SIGINT or SIGPIPE (128 + the signal's number).
RET_INTERRUPTED, RET_BROKEN_PIPE = 130, 141
# How long `run` waits for a first advert before it says that no node is advertising.
NO_NODES_HINT_S = 5.0
log = logging.getLogger(__name__)

VERBOSITY = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}
T = TypeVar("T")


def cmd_demo(args: argparse.Namespace) -> int:
    """Embedded server + simulated workers + a built-in kernel's pattern (the search by default)."""
    from .demo import demo, demo_chunks, print_pattern

    if args.plot and (problem := plot_problem(args.plot)):
        err.print(f"vramfabric demo: {problem}")
        return RET_USAGE
    metrics = CoordinatorMetrics()
    workers_port = None
    if args.metrics_port is not None:
        serve_metrics(metrics, args.metrics_port, CoordinatorSettings.from_env().metrics_addr)
        workers_port = args.metrics_port and args.metrics_port + 1
        where = f"ports {workers_port}..{workers_port + args.workers - 1}" if workers_port else ""
        err.print(f"worker metrics: {where or 'free ports'}")
    with progress_bar(not args.json, demo_chunks(args.kernel, args.configs)) as progress:
        summary = demo(
            args.workers,
            args.simulate,
            args.slice,
            args.configs,
            progress,
            args.verbose > 1,
            metrics,
            workers_port,
            with_auth=args.auth,
            port=args.port,
            kernel=args.kernel,
        )
    if args.json:
        print(json.dumps(summary), flush=True)
    elif args.kernel == "hyperparam":
        print_demo(summary)
    else:
        print_pattern(summary)
    ok = (
        summary["failed"] == 0
        and summary["matches_reference"]
        and summary["leased_bytes_after"] == 0
    )
    plotted = _plot(summary["series"], args.plot) if args.plot else True
    return (RET_OK if plotted else RET_FAILED) if ok else RET_JOB_FAILED


def cmd_server(args: argparse.Namespace) -> int:
    """Run an embedded nats-server in the foreground until interrupted.

    With --tenants, a change to the tenants file (or SIGHUP) is applied while it runs.
    """
    if args.cluster > 1 and args.tenants:
        # The cluster would start without the tenants' config: auth silently off.
        err.print("vramfabric: --cluster and --tenants cannot be combined yet (auth would be off)")
        return RET_USAGE
    # Block the signals first so sigtimedwait receives them instead of their default action.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    server: NatsServer | LocalCluster | AuthServer
    authed: AuthServer | None = None
    if args.cluster > 1:
        server = LocalCluster(size=args.cluster, base_dir=args.store).start()
        asyncio.run(server.wait_jetstream())
        hint = f"export VRAMFABRIC_NATS_URL={server.url} VRAMFABRIC_REPLICAS={args.cluster}"
    elif args.tenants:
        server = authed = _auth_server(args)
        hint = (
            f"export VRAMFABRIC_NATS_URL={authed.server.url} VRAMFABRIC_NATS_USER=<tenant> "
            "VRAMFABRIC_TENANT=<tenant> VRAMFABRIC_NATS_PASSWORD=<its password>; "
            "workers (no passwords but their own): "
            f"VRAMFABRIC_NATS_USER={tenants.WORKERS_USER} "
            f"VRAMFABRIC_TENANTS={authed.policy_file}"
        )
    else:
        server = NatsServer(port=args.port, store_dir=args.store).start()
        hint = f"export VRAMFABRIC_NATS_URL={server.url}"
    print(f"nats-server ready: {hint}", flush=True)
    try:
        while True:
            # Woken each second to notice a rewritten tenants file.
            got = signal.sigtimedwait({signal.SIGINT, signal.SIGTERM, signal.SIGHUP}, 1.0)
            if got is not None and got.si_signo != signal.SIGHUP:
                break
            if authed is not None and (got is not None or authed.changed()):
                _reload(authed)
    finally:
        server.stop()
    return RET_OK


def _reload(authed: AuthServer) -> None:
    """Apply the tenants file again; a bad file is one error line, the old tenants stay."""
    try:
        count = authed.reload()
    except (ValueError, VramfabricError) as exc:
        err.print(f"vramfabric server: tenants not reloaded: {exc}", soft_wrap=True)
        return
    print(f"tenants reloaded: {count} tenant(s)", flush=True)


def cmd_up(args: argparse.Namespace) -> int:
    """Run a local fabric (embedded server and simulated workers) until interrupted."""
    from vramfabric.broker import discovery

    from .local import LocalFleet

    path, pid = discovery.discovery_path(os.environ), os.getpid()
    if (running := discovery.live_url(os.environ)) is not None:
        # A second `up` would take the discovery file over and delete it on exit.
        err.print(
            f"vramfabric up: a fabric is already up at {running} (see {path}); "
            "stop it first, or give this one its own XDG_RUNTIME_DIR"
        )
        return RET_FAILED
    fleet = LocalFleet(
        workers=args.workers,
        simulate=args.simulate,
        slice_size=args.slice,
        port=args.port,
        worker_args=("--allow-code",) if args.allow_code else (),
        verbose=args.verbose > 1,
        metrics_port=args.metrics_port,
    )
    try:
        fleet.start()
        if fleet.metrics_urls:
            err.print(f"worker metrics: {' '.join(fleet.metrics_urls)}", soft_wrap=True)
        # Blocked only now: children inherit the mask, and workers must still get SIGTERM.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        discovery.write(path, fleet.broker.url, pid)
        print(
            f"vramfabric up: {fleet.broker.url} ({args.workers} worker(s) of {args.simulate}); "
            f"clients find it through {path}; Ctrl-C stops it",
            flush=True,
        )
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        discovery.remove(path, pid)
        fleet.stop()
    return RET_OK


def _auth_server(args: argparse.Namespace) -> AuthServer:
    """A server with the tenants file's config, provisioned, and the workers' policy file.

    The operator's password comes from VRAMFABRIC_NATS_PASSWORD, or from the file when it
    holds it in plain text (a bcrypt hash cannot log in).
    """
    file = tenants.load(args.tenants)
    password = os.environ.get("VRAMFABRIC_NATS_PASSWORD") or file.operator.password
    if not password or password.startswith("$2"):
        raise ValueError("set VRAMFABRIC_NATS_PASSWORD to the operator's password")
    return AuthServer(
        Path(args.tenants), BrokerSettings.from_env(), password, args.port, args.store
    ).start()


def cmd_worker(args: argparse.Namespace) -> int:
    """Run a node agent ."""
    from vramfabric.worker.__main__ import run

    return run(args)


def cmd_run(args: argparse.Namespace) -> int:
    """Run a JOB.toml against a running fabric."""
    from vramfabric.coordinator.jobfile import load

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
    seen = _Seen(spec.job.size or 0)
    try:
        with progress_bar(not args.json, seen.total) as progress:
            result = asyncio.run(_run(spec, seen.watching(progress), args))
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
    plotted = _plot(result.series, args.plot) if args.plot else True
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
    err.print(f"metrics: http://{addr}:{port}/metrics")


async def _run(spec: JobFile, progress: Any, args: argparse.Namespace) -> JobResult | None:
    settings, metrics = CoordinatorSettings.from_env(), CoordinatorMetrics()
    if args.metrics_port is not None:
        serve_metrics(metrics, args.metrics_port, settings.metrics_addr)
    broker = BrokerSettings.from_env()
    async with await Fabric.connect(broker, settings, metrics) as fabric:
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


def _plot(series: Any, path: str) -> bool:
    """Draw the lease plot after the summary is out; a failure is reported, not raised."""
    from .plot import plot_series

    try:
        err.print(f"lease plot written to {plot_series(series, path)}")
    except (ImportError, OSError, ValueError) as exc:
        err.print(f"vramfabric: the lease plot was not written to {path}: {exc}")
        return False
    return True


def cmd_status(args: argparse.Namespace) -> int:
    """Print the fleet: nodes, GPUs, slices free and leased, leases by tenant and job."""
    adverts = asyncio.run(_adverts(BrokerSettings.from_env()))
    status = status_dict(adverts)
    policy = tenants.load_policy(args.tenants) if args.tenants else tenants.TenantPolicy()
    status["tenants"] = tenant_rows(adverts, policy)
    if args.json:
        print(json.dumps(status))
    else:
        print_status(status)
    return RET_OK


def cmd_jobs(args: argparse.Namespace) -> int:
    """List the tenant's newest jobs (or all): id, kernel, state, done/failed/total, age."""
    limit = None if args.all else args.limit
    page = _lifecycle(lambda c, b, t: joblist.list_jobs(c, b, t, limit))
    now = time.time()
    if args.json:
        print(json.dumps([i.as_dict(now) for i in page.jobs], default=jsonable))
    else:
        print_jobs(list(page.jobs), now)
    if len(page.jobs) < page.total:
        err.print(
            f"vramfabric: showing the {len(page.jobs)} most recently active of {page.total} "
            "jobs; --limit N or --all for more"
        )
    return RET_OK


def cmd_job(args: argparse.Namespace) -> int:
    """Show one job: progress, failures by kind, the aggregate if stored."""
    info = _lifecycle(lambda c, b, t: joblist.inspect(c, b, t, args.id))
    if args.json:
        print(json.dumps(info.as_dict(time.time()), default=jsonable))
    else:
        print_job(info, time.time())
    return RET_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    """Stop a job: consumer deleted, leases released by its coordinator, chunks left unrun."""
    cancelled = _lifecycle(lambda c, b, t: lifecycle.cancel(c, b, t, args.id))
    if args.json:
        print(json.dumps({"job": args.id, "cancelled": cancelled}))
    else:
        print(f"job {args.id} " + ("cancelled" if cancelled else "had already finished"))
    return RET_OK


def cmd_kernel_check(args: argparse.Namespace) -> int:
    """Compile a CUDA source with NVRTC for the target architectures; errors name the line."""
    path = Path(args.file)
    archs = parse_archs(args.arch) if args.arch else CudaSettings.from_env().archs
    try:
        source = path.read_text()
    except OSError as exc:
        err.print(f"vramfabric: cannot read {path}: {exc}")
        return RET_USAGE
    if not check_source(path.stem, source, args.entry, archs):
        err.print("vramfabric: nvrtc not installed (pip install 'vramfabric[cuda]'): not checked")
        return RET_FAILED
    print(f"{path}: {args.entry} compiles for {','.join(archs)}")
    return RET_OK


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete a job: results, spec, record, consumer, checkpoints and outputs."""
    _lifecycle(lambda c, b, t: lifecycle.remove(c, b, t, args.id))
    print(json.dumps({"job": args.id, "removed": True}) if args.json else f"job {args.id} removed")
    return RET_OK


def cmd_gc(args: argparse.Namespace) -> int:
    """Remove jobs finished before the retention, then uploaded work no stored job names."""
    settings = CoordinatorSettings.from_env()
    retention_s = settings.job_retention_s if args.retention_s is None else args.retention_s
    done = _lifecycle(lambda c, b, t: housekeep(c, b, t, retention_s, time.time()))
    if args.json:
        print(json.dumps({"jobs": list(done.jobs), "blobs": list(done.blobs)}))
    else:
        print(f"removed {len(done.jobs)} jobs and {len(done.blobs)} uploaded blobs")
    return RET_OK


def _lifecycle(call: Callable[[Connection, BrokerSettings, str], Awaitable[T]]) -> T:
    """Run one lifecycle call for the environment's tenant over a fresh connection."""

    async def go() -> T:
        broker = BrokerSettings.from_env()
        conn = await connect(broker, name="vramfabric-cli")
        try:
            return await call(conn, broker, CoordinatorSettings.from_env().tenant)
        finally:
            await conn.close()

    return asyncio.run(go())


def tenant_rows(adverts: list[NodeAdvert], policy: tenants.TenantPolicy) -> list[dict[str, Any]]:
    """Per tenant: fleet-wide usage, quota, weight, fair share and whether it waits."""
    usage: dict[str, int] = {}
    for a in adverts:
        for tenant, n_bytes in a.tenants.items():
            usage[tenant] = usage.get(tenant, 0) + n_bytes
    waiting = {t for a in adverts for t in a.waiting}
    active = {t for t, n in usage.items() if n > 0} | waiting
    names = sorted(active | set(policy.tenants))
    capacity = sum(g.total_bytes for a in adverts for g in a.gpus if g.healthy)
    total_weight = sum(policy.weight(t) for t in active) or 1.0
    return [
        {
            "tenant": t,
            "usage_bytes": usage.get(t, 0),
            "quota_bytes": policy.quota_bytes(t),
            "weight": policy.weight(t),
            "share_bytes": int(capacity * policy.weight(t) / total_weight) if t in active else 0,
            "waiting": t in waiting,
        }
        for t in names
    ]


async def _adverts(broker: BrokerSettings) -> list[NodeAdvert]:
    conn = await connect(broker, name="status")
    try:
        stored = await stored_adverts(conn, broker)
    finally:
        await conn.close()
    out = []
    for node, data in sorted(stored.items()):
        try:
            out.append(decode(NodeAdvert, data))
        except InvalidMessage as exc:  # counted out, as coordinators do: the rest still show
            log.warning("bad advert ignored node=%s error=%s", node, exc)
    return out


def add_metrics_port(
    parser: argparse.ArgumentParser, whose: str, default: int = DEFAULT_METRICS_PORT
) -> None:
    """The `--metrics-port [PORT]` flag of a command that serves metrics."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        nargs="?",
        const=default,
        help=f"serve Prometheus metrics ({whose}) on this port ({default} if no "
        "number, 0: any free ports)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="vramfabric", description="GPU memory as a pool of leasable VRAM slices."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="embedded fabric + a built-in CUDA kernel's pattern")
    p.add_argument(
        "--kernel",
        default="hyperparam",
        choices=("hyperparam", "montecarlo", "inference", "tiles", "fitness"),
        help="the pattern to run (default hyperparam: the 1000-configuration search)",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--simulate", default="4x80GiB", help="GPUs per worker (default 4x80GiB)")
    p.add_argument("--slice", default="512MiB", help="slice per configuration (default 512MiB)")
    p.add_argument(
        "--configs",
        type=int,
        default=1000,
        choices=range(1, 1001),
        metavar="1..1000",
        help="configurations searched (hyperparam only; default 1000)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    add_metrics_port(p, "the coordinator's; its workers use the ports after it")
    p.add_argument("--plot", metavar="PNG", help="draw leases and chunks done over time here")
    p.add_argument("--auth", action="store_true", help="run with auth on: a generated tenants file")
    p.add_argument("--port", type=int, default=-1, help="server port (default: a free one)")
    p.set_defaults(handler=cmd_demo)
    p = sub.add_parser("server", help="run an embedded nats-server with JetStream")
    p.add_argument("--port", type=int, default=4222)
    p.add_argument("--store", help="JetStream store directory (default: a temp dir)")
    p.add_argument(
        "--cluster",
        type=int,
        default=1,
        choices=(1, 3, 5),
        help="run a local cluster of this many routed servers (free ports)",
    )
    p.add_argument(
        "--tenants",
        help="tenants file (TOML): run with auth on, one user per tenant (docs/operations.md)",
    )
    p.set_defaults(handler=cmd_server)
    p = sub.add_parser("up", help="run a local fabric until Ctrl-C; Fabric.connect() finds it")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--simulate", default="4x80GiB", help="GPUs per worker (default 4x80GiB)")
    p.add_argument("--slice", default="512MiB", help="workers' slice size (default 512MiB)")
    p.add_argument("--port", type=int, default=-1, help="server port (default: a free one)")
    p.add_argument("--allow-code", action="store_true", help="workers run Python functions")
    add_metrics_port(p, "the workers': worker i on PORT+i", DEFAULT_WORKER_METRICS_PORT)
    p.set_defaults(handler=cmd_up)
    from vramfabric.worker.__main__ import add_arguments

    p = sub.add_parser("worker", help="run a node agent")
    add_arguments(p)
    p.set_defaults(handler=cmd_worker)
    p = sub.add_parser("run", help="run a JOB.toml against a running fabric")
    p.add_argument("jobfile")
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout-s", type=float, default=None, help="give up on the job after this")
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="run again the chunks that failed or ran out of retries in an earlier run",
    )
    p.add_argument(
        "--no-wait",
        action="store_true",
        help=f"exit 7 if no node advertises within {NO_NODES_HINT_S:.0f}s (default: wait)",
    )
    add_metrics_port(p, "the coordinator's")
    p.add_argument("--plot", metavar="PNG", help="draw leases and chunks done over time here")
    p.set_defaults(handler=cmd_run)
    p = sub.add_parser("status", help="show live nodes, slices free and leased, usage per tenant")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--tenants", help="tenants or policy file (no credentials needed): quotas and weights"
    )
    p.set_defaults(handler=cmd_status)
    _add_job_commands(sub)
    notebook.add_parser(sub)
    kernel = sub.add_parser("kernel", help="CUDA kernel tools").add_subparsers(required=True)
    p = kernel.add_parser("check", help="compile FILE.cu with NVRTC; errors name the line")
    p.add_argument("file")
    p.add_argument("--entry", required=True, help='the extern "C" __global__ function')
    p.add_argument("--arch", help="e.g. sm_90 or sm_80,sm_90 (default VRAMFABRIC_CUDA_ARCHS)")
    p.set_defaults(handler=cmd_kernel_check)
    return parser


def _add_job_commands(sub: Any) -> None:
    p = sub.add_parser("jobs", help="list jobs: id, kernel, state, done/failed/total, age")
    p.add_argument(
        "--limit",
        type=_positive_int,
        default=joblist.DEFAULT_PAGE,
        help=f"the N jobs started, finished or cancelled last (default {joblist.DEFAULT_PAGE})",
    )
    p.add_argument("--all", action="store_true", help="every job (reads every run record)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_jobs)
    p = sub.add_parser("gc", help="remove old finished jobs and uploaded work no job names")
    p.add_argument(
        "--retention-s",
        type=_seconds,
        help="remove jobs finished longer ago than this (default VRAMFABRIC_JOB_RETENTION_S, "
        "a week; 0 removes no job)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_gc)
    for name, handler, what in (
        ("job", cmd_job, "show a job's progress, failures by kind and aggregate"),
        ("cancel", cmd_cancel, "stop a job: consumer deleted, leases released, chunks unrun"),
        ("rm", cmd_rm, "delete a job's results, spec, consumer and checkpoints"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("id", help="the job id (see `vramfabric jobs`)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(handler=handler)


def _positive_int(text: str) -> int:
    """An integer of at least 1 (an argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _seconds(text: str) -> float:
    """A number of seconds, 0 or more (an argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, not {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `vramfabric` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=VERBOSITY.get(args.verbose, logging.DEBUG),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        return int(args.handler(args))
    except BrokenPipeError:
        return _broken_pipe()
    except KeyboardInterrupt:
        err.print(f"vramfabric {args.command}: interrupted")
        return RET_INTERRUPTED
    except (VramfabricError, ValueError, OSError) as exc:
        log.info("command failed", exc_info=exc)  # the traceback, with -v
        err.print(f"vramfabric: {_one_line(str(exc))}")
        return next(code for kind, code in _EXIT_CODES if isinstance(exc, kind))
    except Exception as exc:
        # A bug: one line, and the traceback only when asked for.
        if args.verbose:
            raise
        err.print(f"vramfabric: internal error: {type(exc).__name__}: {exc} (-v shows where)")
        return RET_FAILED


def _one_line(message: str) -> str:
    """A message's first line and, when it carries a log (nats-server's), its last: the cause."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) <= 1:
        return message.strip()
    head = lines[0].removesuffix(":")
    return f"{head}: ... {lines[-1]} (-v shows all {len(lines)} lines)"


def _broken_pipe() -> int:
    """The reader of stdout went away (`| head`): stop quietly, as SIGPIPE stops other tools."""
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return RET_BROKEN_PIPE


# The exit code of a command that failed, by error; the first match wins.
_EXIT_CODES: tuple[tuple[type[Exception], int], ...] = (
    (Disconnected, RET_CONNECT),
    (JobTimeout, RET_JOB_FAILED),
    (JobNotFound, RET_NOT_FOUND),
    (JobCancelled, RET_CANCELLED),
    (Exception, RET_FAILED),
)


if __name__ == "__main__":
    sys.exit(main())
