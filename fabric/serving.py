"""The commands that start parts of a fabric: `server`, `up` and `worker`.

They parse without the other commands' parsers (cli.py, `parse`), whose modules (the
coordinator, NumPy, rich) cost `vramfabric up` 0.5 s before it began.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vramfabric.broker.errors import VramfabricError
from vramfabric.worker.node.flags import DEFAULT_METRICS_PORT as DEFAULT_WORKER_METRICS_PORT

from .exits import RET_FAILED, RET_OK, RET_USAGE
from .flags import add_metrics_port
from .server_flags import MEMBER_HINT, add_server_flags, member, server_tls

if TYPE_CHECKING:
    from vramfabric.broker.cluster import LocalCluster
    from vramfabric.broker.server import NatsServer
    from vramfabric.broker.tls import ServerTls

    from .authserver import AuthServer

SERVING = ("server", "up", "worker")


def cmd_server(args: argparse.Namespace) -> int:
    """Run an embedded nats-server in the foreground until interrupted.

    With --tenants, a change to the tenants file (or SIGHUP) is applied while it runs.
    """
    from .report import err

    clustered = "--cluster" if args.cluster > 1 else "--routes" if args.routes else ""
    if clustered and args.tenants:
        # The cluster would start without the tenants' config: auth silently off.
        err.print(f"vramfabric: {clustered} and --tenants cannot be combined yet (auth off)")
        return RET_USAGE
    try:
        tls = server_tls(args)
        joining = member(args, tls)
    except ValueError as exc:
        err.print(f"vramfabric server: {exc}", soft_wrap=True)
        return RET_USAGE
    # Block the signals first so sigtimedwait receives them instead of their default action.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    server, authed, hint = _start_server(args, joining, tls)
    print(f"nats-server ready: {hint}", flush=True)
    try:
        _serve_until_stopped(authed)
    finally:
        server.stop()
    return RET_OK


def _start_server(
    args: argparse.Namespace, joining: NatsServer | None, tls: ServerTls | None
) -> tuple[NatsServer | LocalCluster | AuthServer, AuthServer | None, str]:
    """Start the server the flags ask for: (it, its AuthServer if --tenants, the env hint)."""
    import asyncio

    from vramfabric.broker import tenants
    from vramfabric.broker.cluster import LocalCluster
    from vramfabric.broker.server import NatsServer

    if joining is not None:
        member_server = joining.start()
        hint = f"export VRAMFABRIC_NATS_URL={member_server.url}{_tls_env(tls)}"
        return member_server, None, f"{hint} (cluster member; {MEMBER_HINT})"
    if args.cluster > 1:
        cluster = LocalCluster(
            size=args.cluster, base_dir=args.store, name=args.cluster_name, host=args.host, tls=tls
        ).start()
        asyncio.run(cluster.wait_jetstream())
        hint = f"export VRAMFABRIC_NATS_URL={cluster.url} VRAMFABRIC_REPLICAS={args.cluster}"
        return cluster, None, hint + _tls_env(tls)
    if args.tenants:
        authed = _auth_server(args, tls)
        hint = (
            f"export VRAMFABRIC_NATS_URL={authed.server.url} VRAMFABRIC_NATS_USER=<tenant> "
            "VRAMFABRIC_TENANT=<tenant> VRAMFABRIC_NATS_PASSWORD=<its password>; "
            "workers (no passwords but their own): "
            f"VRAMFABRIC_NATS_USER={tenants.WORKERS_USER} "
            f"VRAMFABRIC_TENANTS={authed.policy_file}"
        )
        if tls_env := _tls_env(tls):
            hint += f"; all of them:{tls_env}"
        return authed, authed, hint
    server = NatsServer(port=args.port, store_dir=args.store, host=args.host, tls=tls).start()
    return server, None, f"export VRAMFABRIC_NATS_URL={server.url}{_tls_env(tls)}"


def _serve_until_stopped(authed: AuthServer | None) -> None:
    """Wait for SIGINT or SIGTERM; on SIGHUP or a rewritten tenants file, reload it."""
    while True:
        # Woken each second to notice a rewritten tenants file.
        got = signal.sigtimedwait({signal.SIGINT, signal.SIGTERM, signal.SIGHUP}, 1.0)
        if got is not None and got.si_signo != signal.SIGHUP:
            return
        if authed is not None and (got is not None or authed.changed()):
            _reload(authed)


def _tls_env(tls: ServerTls | None) -> str:
    """What clients of a TLS server set besides its URL (nothing for a CA they trust)."""
    if tls is None or tls.ca_file is None:
        return ""
    hint = f" VRAMFABRIC_TLS_CA={tls.ca_file}"
    if tls.verify_clients:
        hint += " VRAMFABRIC_TLS_CERT=<client certificate> VRAMFABRIC_TLS_KEY=<its key>"
    return hint


def _reload(authed: AuthServer) -> None:
    """Apply the tenants file again; a bad file is one error line, the old tenants stay."""
    from .report import err

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
        from .report import err

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
        fork=True,  # this process holds no thread and no secret: workers start 0.15 s sooner
    )
    try:
        fleet.start()
        if fleet.metrics_urls:
            print(f"worker metrics: {' '.join(fleet.metrics_urls)}", file=sys.stderr, flush=True)
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


def _auth_server(args: argparse.Namespace, tls: ServerTls | None) -> AuthServer:
    """A server with the tenants file's config, provisioned, and the workers' policy file.

    The operator's password comes from VRAMFABRIC_NATS_PASSWORD, or from the file when it
    holds it in plain text (a bcrypt hash cannot log in).
    """
    from vramfabric.broker import tenants
    from vramfabric.broker.settings import BrokerSettings

    from .authserver import AuthServer

    file = tenants.load(args.tenants)
    password = os.environ.get("VRAMFABRIC_NATS_PASSWORD") or file.operator.password
    if not password or password.startswith("$2"):
        raise ValueError("set VRAMFABRIC_NATS_PASSWORD to the operator's password")
    return AuthServer(
        Path(args.tenants),
        BrokerSettings.from_env(),
        password,
        args.port,
        args.store,
        tls=tls,
        host=args.host,
    ).start()


def cmd_worker(args: argparse.Namespace) -> int:
    """Run a node agent ."""
    from vramfabric.worker.__main__ import run

    return run(args)


def add_serving(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `server`, `up` and `worker` commands."""
    p = sub.add_parser("server", help="run an embedded nats-server with JetStream")
    add_server_flags(p)
    p.set_defaults(handler=cmd_server)
    p = sub.add_parser("up", help="run a local fabric until Ctrl-C; Fabric.connect() finds it")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--simulate", default="4x80GiB", help="GPUs per worker (default 4x80GiB)")
    p.add_argument("--slice", default="512MiB", help="workers' slice size (default 512MiB)")
    p.add_argument("--port", type=int, default=-1, help="server port (default: a free one)")
    p.add_argument("--allow-code", action="store_true", help="workers run Python functions")
    add_metrics_port(p, "the workers': worker i on PORT+i", DEFAULT_WORKER_METRICS_PORT)
    p.set_defaults(handler=cmd_up)
    from vramfabric.worker.node.flags import add_arguments

    p = sub.add_parser("worker", help="run a node agent")
    add_arguments(p)
    p.set_defaults(handler=cmd_worker)
