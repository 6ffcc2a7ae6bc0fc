"""`python -m vramfabric.worker`: run one node agent until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

import attrs

from vramfabric.broker.errors import Disconnected, ExecutorCrashed, PermanentError
from vramfabric.broker.settings import BrokerSettings, parse_size
from vramfabric.broker.stopping import stop_task

from .executor.hardening import make_undumpable
from .node.flags import add_arguments
from .node.settings import WorkerSettings

if TYPE_CHECKING:
    from vramfabric.broker.connection import Connection

    from .agent import Agent
    from .colocated import Colocated

RET_OK, RET_USAGE, RET_CONNECT, RET_CHECK_FAILED = 0, 2, 3, 1
# The node's executor processes cannot start (the start-up probe failed).
RET_EXECUTORS = 5
# After a stop signal the worker is gone within its drain grace plus this, whatever it is
# doing (a start stuck on an executor, a server that does not answer): then it exits hard.
STOP_SLACK_S = 5.0
VERBOSITY = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}
log = logging.getLogger(__name__)


def worker_settings(args: argparse.Namespace) -> WorkerSettings:
    """Settings from the environment, overridden by flags."""
    settings = WorkerSettings.from_env()
    changes: dict[str, object] = {}
    if args.simulate:
        changes["simulate"] = args.simulate
    if args.slice_size:
        changes["slice_bytes"] = parse_size(args.slice_size)
    if args.node:
        changes["node"] = args.node
    if args.heartbeat_s:
        changes["heartbeat_s"] = args.heartbeat_s
    if args.metrics_port is not None:
        changes["metrics_port"] = args.metrics_port
    # The switches can only turn on what the environment left off.
    changes.update({k: True for k in ("allow_code", "allow_shared_uid") if getattr(args, k)})
    if args.isolation:
        changes["isolation"] = args.isolation
    if args.chunk_timeout_s:
        changes["chunk_timeout_s"] = args.chunk_timeout_s
    if args.kernel_module:
        # Imported here too, so a bad module fails the start rather than every chunk (and only
        # here: the built-ins bring NumPy, which the agent itself never needs).
        from vramfabric.kernels import builtin_registry
        from vramfabric.kernels.registry import load_registry

        load_registry(builtin_registry(), args.kernel_module)
        changes["kernel_modules"] = tuple(args.kernel_module)
    return attrs.evolve(settings, **changes)  # type: ignore[arg-type]


async def check(broker: BrokerSettings, node: str) -> int:
    """RET_OK if `node`'s advert in KV is younger than the node TTL, else RET_CHECK_FAILED."""
    from vramfabric.broker import buckets
    from vramfabric.broker.codec import decode
    from vramfabric.broker.connection import connect
    from vramfabric.broker.messages import NodeAdvert

    conn = await connect(broker, name=f"check-{node}")
    try:
        kv = await buckets.nodes_bucket(conn.js, broker)
        try:
            advert = decode(NodeAdvert, (await kv.get(node)).value or b"")
        except Exception as exc:  # a missing key, a limit marker or a bad advert: not fresh
            print(f"vramfabric worker --check: node {node}: {exc}", file=sys.stderr)
            return RET_CHECK_FAILED
        age_s = time.time() - advert.sent_at
        return RET_OK if age_s < broker.node_ttl_s else RET_CHECK_FAILED
    finally:
        await conn.close()


async def connect_patiently(broker: BrokerSettings, name: str) -> Connection:
    """Connect, retrying within the broker's retry deadline: a node may start before NATS."""
    from vramfabric.broker.connection import connect

    return await broker.call_retry.call(lambda: connect(broker, name=name), what="connect")


def preload() -> None:
    """Import what `serve` imports: a worker forked from this process then starts at once."""
    from . import agent, colocated  # noqa: F401
    from .node import metrics  # noqa: F401


async def serve(broker: BrokerSettings, settings: WorkerSettings, nodes: int = 1) -> int:
    """Run the agent (or `nodes` simulated ones side by side) until a stop signal.

    SIGTERM drains: running chunks finish within the grace, every lease is released.
    """
    # The agent's modules load here, not with this module: `vramfabric up` and the other
    # commands that only parse the worker's flags (fabric/serving.py) do not pay for them.
    from .agent import Agent
    from .colocated import Colocated
    from .node.metrics import WorkerMetrics

    metrics, url = WorkerMetrics(), ""
    if settings.metrics_port is not None:
        # First, so a port in use fails the start before anything else has begun.
        try:
            port = metrics.serve(settings.metrics_port, settings.metrics_addr)
        except OSError as exc:
            raise ValueError(f"metrics port {settings.metrics_port}: {exc}") from exc
        from vramfabric.broker.server import host_port  # an IPv6 address in brackets

        url = f" metrics=http://{host_port(settings.metrics_addr, port)}/metrics"
    # Signals first: a stop must work while connecting and starting too.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_stop_signal, stop, settings.drain_grace_s)
    connecting = loop.create_task(connect_patiently(broker, f"worker-{settings.node}"))
    if not await _first(connecting, stop):
        return RET_OK
    conn = connecting.result()
    agent: Agent | Colocated = (
        Agent(broker, settings, conn, metrics)
        if nodes == 1
        else Colocated(broker, settings, conn, nodes, metrics)
    )
    try:
        starting = loop.create_task(agent.start())
        if not await _first(starting, stop):
            await agent.abort()
            return RET_OK
        starting.result()  # raises what ended the start, if anything did
        # Tell a parent (the demo, tests) we serve: it waits for this line, not a timer.
        named = settings.node if nodes == 1 else f"{settings.node}-0..{nodes - 1}"
        print(f"worker ready node={named}{url}", flush=True)
        await stop.wait()
        await agent.stop()
        return RET_OK
    except ExecutorCrashed as exc:
        await agent.abort()
        print(f"vramfabric worker: executors cannot start: {exc}", file=sys.stderr)
        return RET_EXECUTORS
    finally:
        await conn.close()


async def _first(task: asyncio.Task[object], stop: asyncio.Event) -> bool:
    """Wait for `task` or a stop signal; False (the task cancelled) if the signal came first."""
    stopped = asyncio.get_running_loop().create_task(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done():
        return True
    await stop_task(task)  # until it has ended: a connect or a publish may swallow a cancel
    log.info("stopped before the worker was ready")
    return False


def _on_stop_signal(stop: asyncio.Event, grace_s: float) -> None:
    """Begin the drain; arm a timer that ends the process if the drain overruns."""
    if stop.is_set():
        return
    stop.set()
    timer = threading.Timer(grace_s + STOP_SLACK_S, _exit_hard, (grace_s,))
    timer.daemon = True
    timer.start()


def _exit_hard(grace_s: float) -> None:
    log.error("stop overran drain grace %.1fs + %.1fs: exiting now", grace_s, STOP_SLACK_S)
    # The executors die with this process (PR_SET_PDEATHSIG); leases expire by their TTL.
    os._exit(RET_OK)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m vramfabric.worker`."""
    parser = argparse.ArgumentParser(prog="vramfabric-worker", description=__doc__)
    add_arguments(parser)
    parser.set_defaults(verbose=0)
    args = parser.parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Run a worker from parsed flags (also used by `vramfabric worker`)."""
    logging.basicConfig(
        level=VERBOSITY.get(args.verbose, logging.DEBUG),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        force=True,  # a worker forked from `vramfabric up` logs at its own level, not up's
    )
    # The environment holds the workers' password: keep tenants' executors out of it.
    make_undumpable()
    try:
        broker = BrokerSettings.from_env()
        settings = worker_settings(args)
        if settings.simulate:  # its GPUs are known now: refuse before connecting
            from .node.gpus import check_slice, parse_simulate

            check_slice(parse_simulate(settings.simulate), settings.slice_bytes)
    except (ValueError, ImportError) as exc:
        print(f"vramfabric worker: {exc}", file=sys.stderr)
        return RET_USAGE
    try:
        if args.check:
            if not args.node:
                raise ValueError("--check needs --node NAME (the node to check)")
            return asyncio.run(check(broker, settings.node))
        if args.nodes < 1:
            raise ValueError(f"--nodes must be at least 1, not {args.nodes}")
        if args.nodes > 1 and not settings.simulate:
            raise ValueError("--nodes runs simulated nodes side by side: give --simulate too")
        return asyncio.run(serve(broker, settings, args.nodes))
    except Disconnected as exc:
        print(f"vramfabric worker: {exc}", file=sys.stderr)
        return RET_CONNECT
    except PermanentError as exc:  # refused for good: a TLS handshake, a password, a grant
        print(f"vramfabric worker: {exc}", file=sys.stderr)
        return RET_CONNECT
    except ValueError as exc:
        print(f"vramfabric worker: {exc}", file=sys.stderr)
        return RET_USAGE


if __name__ == "__main__":
    sys.exit(main())
