"""`vramfabric`: demo, server, worker, run and status subcommands (argparse, one cmd_* each)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import Any

from vramfabric.broker import topology
from vramfabric.broker.cluster import LocalCluster
from vramfabric.broker.codec import decode
from vramfabric.broker.connection import connect
from vramfabric.broker.errors import Disconnected, JobTimeout, ServerError, VramfabricError
from vramfabric.broker.messages import NodeAdvert
from vramfabric.broker.server import NatsServer
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator.fabric import Fabric, JobResult
from vramfabric.coordinator.jobfile import JobFile
from vramfabric.coordinator.settings import CoordinatorSettings

from .report import advert_dict, err, jsonable, print_demo, progress_bar, report

RET_OK, RET_FAILED, RET_USAGE, RET_CONNECT, RET_JOB_FAILED = 0, 1, 2, 3, 4
VERBOSITY = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}
GIB = 2**30


def cmd_demo(args: argparse.Namespace) -> int:
    """Embedded server + simulated workers + the 1000-configuration search."""
    from .demo import demo

    with progress_bar(not args.json, args.configs) as progress:
        summary = demo(
            args.workers, args.simulate, args.slice, args.configs, progress, args.verbose > 1
        )
    if args.json:
        print(json.dumps(summary))
    else:
        print_demo(summary)
    ok = (
        summary["failed"] == 0
        and summary["matches_reference"]
        and summary["leased_bytes_after"] == 0
    )
    return RET_OK if ok else RET_JOB_FAILED


def cmd_server(args: argparse.Namespace) -> int:
    """Run an embedded nats-server in the foreground until interrupted."""
    # Block the stop signals first so sigwait receives them instead of their default action.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    server: NatsServer | LocalCluster
    if args.cluster > 1:
        server = LocalCluster(size=args.cluster, base_dir=args.store).start()
        asyncio.run(server.wait_jetstream())
        hint = f"export VRAMFABRIC_NATS_URL={server.url} VRAMFABRIC_REPLICAS={args.cluster}"
    else:
        server = NatsServer(port=args.port, store_dir=args.store).start()
        hint = f"export VRAMFABRIC_NATS_URL={server.url}"
    print(f"nats-server ready: {hint}", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.stop()
    return RET_OK


def cmd_worker(args: argparse.Namespace) -> int:
    """Run a node agent ."""
    from vramfabric.worker.__main__ import run

    return run(args)


def cmd_run(args: argparse.Namespace) -> int:
    """Run a JOB.toml against a running fabric."""
    from vramfabric.coordinator.jobfile import load

    try:
        spec = load(args.jobfile)
    except (ValueError, ImportError) as exc:
        err.print(f"vramfabric run: {exc}")
        return RET_USAGE
    with progress_bar(not args.json, len(spec.job.inputs)) as progress:
        result = asyncio.run(_run(spec, progress, args))
    summary = report(result)
    if args.json:
        print(json.dumps(summary, default=jsonable))
    else:
        print("\n".join(f"{k}: {v}" for k, v in summary.items()))
    return RET_OK if result.ok else RET_JOB_FAILED


async def _run(spec: JobFile, progress: Any, args: argparse.Namespace) -> JobResult:
    async with await Fabric.connect(
        BrokerSettings.from_env(), CoordinatorSettings.from_env()
    ) as fabric:
        if args.metrics_port:
            from prometheus_client import start_http_server

            start_http_server(args.metrics_port, addr="127.0.0.1", registry=fabric.metrics.registry)
        return await fabric.run(
            spec.job,
            spec.aggregator,
            slices=spec.slices,
            progress=progress,
            timeout_s=args.timeout_s,
            retry_failed=args.retry_failed,
        )


def cmd_status(args: argparse.Namespace) -> int:
    """Print every live node's GPUs, free and leased VRAM, and tenants' usage."""
    adverts = asyncio.run(_adverts(BrokerSettings.from_env()))
    if args.json:
        print(json.dumps([advert_dict(a) for a in adverts]))
        return RET_OK
    if not adverts:
        print("no live nodes")
    for a in adverts:
        free = sum(g.free_bytes for g in a.gpus)
        leased = sum(g.leased_bytes for g in a.gpus)
        print(
            f"{a.node}: {len(a.gpus)} GPU(s), {free / GIB:.1f} GiB free, "
            f"{leased / GIB:.1f} GiB leased, tenants {dict(a.tenants) or '-'}"
        )
    return RET_OK


async def _adverts(broker: BrokerSettings) -> list[NodeAdvert]:
    conn = await connect(broker, name="status")
    try:
        kv = await topology.nodes_bucket(conn.js, broker)
        out = []
        for key in await _keys(kv):
            entry = await kv.get(key)
            if entry.value:
                out.append(decode(NodeAdvert, entry.value))
        return out
    finally:
        await conn.close()


async def _keys(kv: Any) -> list[str]:
    from nats.js.errors import NoKeysError

    try:
        return sorted(await kv.keys())
    except NoKeysError:
        return []


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="vramfabric", description="GPU memory as a pool of leasable VRAM slices."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="embedded fabric + the 1000-configuration search")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--simulate", default="4x80GiB", help="GPUs per worker (default 4x80GiB)")
    p.add_argument("--slice", default="512MiB", help="slice per configuration (default 512MiB)")
    p.add_argument("--configs", type=int, default=1000, choices=range(1, 1001), metavar="1..1000")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
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
    p.set_defaults(handler=cmd_server)
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
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.set_defaults(handler=cmd_run)
    p = sub.add_parser("status", help="show live nodes and their VRAM")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `vramfabric` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=VERBOSITY.get(args.verbose, logging.DEBUG),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        return int(args.handler(args))
    except Disconnected as exc:
        err.print(f"vramfabric: {exc}")
        return RET_CONNECT
    except JobTimeout as exc:
        err.print(f"vramfabric: {exc}")
        return RET_JOB_FAILED
    except (ServerError, VramfabricError, ValueError) as exc:
        err.print(f"vramfabric: {exc}")
        return RET_FAILED


if __name__ == "__main__":
    sys.exit(main())
