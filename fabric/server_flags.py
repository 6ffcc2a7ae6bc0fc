"""The flags of `vramfabric server`, and what they make: its TLS, and a cluster member.

Apart from fabric/serving.py, which runs the command: the parser is built without
importing the broker (`vramfabric up` parses every command's flags before it starts).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vramfabric.broker.server import NatsServer
    from vramfabric.broker.tls import ServerTls

# What a cluster member's ready line adds: its URL alone does not make a cluster's clients.
MEMBER_HINT = (
    "list every member's URL, comma-separated, and set VRAMFABRIC_REPLICAS=3 for R3 streams; "
    "JetStream answers once most members run"
)


def add_server_flags(p: argparse.ArgumentParser) -> None:
    """The `server` command's flags."""
    p.add_argument("--port", type=int, default=4222)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address to listen on for clients (and routes); default 127.0.0.1",
    )
    p.add_argument("--store", help="JetStream store directory (default: a temp dir)")
    p.add_argument(
        "--cluster",
        type=int,
        default=1,
        choices=(1, 3, 5),
        help="run a local cluster of this many routed servers (free ports)",
    )
    p.add_argument(
        "--routes",
        metavar="URL,URL",
        help="join a cluster across hosts: its members' route URLs (nats-route://HOST:PORT; "
        "this server's own may be among them); routes listen on --host and --cluster-port",
    )
    p.add_argument(
        "--cluster-port",
        type=int,
        metavar="PORT",
        help="with --routes: the port peers' routes connect to (default 6222)",
    )
    p.add_argument("--cluster-name", default="vf", help="the cluster's name (default vf)")
    p.add_argument(
        "--server-name",
        help="with --routes: this member's name, unique in the cluster (default: from "
        "--host and --cluster-port)",
    )
    p.add_argument(
        "--tenants",
        help=(
            "tenants file (TOML): run with auth on, one user per tenant "
            "(docs/operations/tenants.md)"
        ),
    )
    p.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="the server's certificate: clients (and routes) must use TLS",
    )
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="the CA that verifies route peers (and clients' certificates with "
        "--tls-verify-clients); default: the system's CAs",
    )
    p.add_argument(
        "--tls-verify-clients",
        action="store_true",
        help="clients must present a certificate --tls-ca signed (mutual TLS)",
    )


def server_tls(args: argparse.Namespace) -> ServerTls | None:
    """The --tls-* flags as the server's TLS (its files checked now), or None without them."""
    from vramfabric.broker.tls import ServerTls

    if not (args.tls_cert or args.tls_key or args.tls_ca or args.tls_verify_clients):
        return None
    if not (args.tls_cert and args.tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    return ServerTls(args.tls_cert, args.tls_key, args.tls_ca, args.tls_verify_clients)


def member(args: argparse.Namespace, tls: ServerTls | None) -> NatsServer | None:
    """With --routes, this host's member of a cluster across hosts (not started); else None.

    Raises:
        ValueError: flags that do not go together, a bad route URL or name.
    """
    from vramfabric.broker.cluster import DEFAULT_ROUTE_PORT, check_name, member_server

    check_name("--cluster-name", args.cluster_name)
    if not args.routes:
        if args.cluster_port is not None or args.server_name:
            raise ValueError("--cluster-port and --server-name go with --routes")
        return None
    if args.cluster > 1:
        raise ValueError("--routes joins servers on other hosts: it does not go with --cluster")
    routes = [r for r in args.routes.split(",") if r.strip()]
    if not routes:
        raise ValueError("--routes needs at least one route URL (nats-route://HOST:PORT)")
    route_port = DEFAULT_ROUTE_PORT if args.cluster_port is None else args.cluster_port
    if not 0 < route_port < 65536:
        raise ValueError(f"--cluster-port {route_port}: not a port from 1 to 65535")
    return member_server(
        routes,
        host=args.host,
        port=args.port,
        store_dir=args.store,
        tls=tls,
        cluster_name=args.cluster_name,
        route_port=route_port,
        server_name=args.server_name,
    )
