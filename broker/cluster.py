"""Clusters of nats-servers with routes, for R3 streams: on one host, or one member per host.

`LocalCluster` runs three (or more) routed servers on one host, for the chaos tests and
`vramfabric server --cluster 3`. Each server keeps its own store, so a killed one restarts
with its data and catches up from the others. `member_config` is the part of one server's
config that joins it to peers on other hosts (`vramfabric server --routes`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path

import attrs

from .errors import ServerError, TransientError
from .retrying import CallRetry
from .server import NatsServer, host_port
from .tls import ServerTls

# The port a cluster member listens on for its peers' routes, by NATS convention.
DEFAULT_ROUTE_PORT = 6222
_ROUTE_SCHEME = "nats-route://"
# nats-server's server names: no spaces (and we keep them to what shows plainly in its logs).
_SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct free ports on `host` (bound and released at once; a race is unlikely)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            sock.bind((host, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def route_url(route: str) -> str:
    """A peer's route as nats-server takes it: `HOST:PORT` or `nats-route://HOST:PORT`.

    Raises:
        ValueError: not a route URL (another scheme, no port, a path).
    """
    text = route.strip()
    rest = text.removeprefix(_ROUTE_SCHEME)
    host, sep, port = rest.rpartition(":")
    if "://" in rest or not sep or not host or "/" in rest or not port.isdigit():
        raise ValueError(f"{route!r} is not a route URL (expected nats-route://HOST:PORT)")
    if not 0 < int(port) < 65536:
        raise ValueError(f"{route!r}: the port is not a number from 1 to 65535")
    return f"{_ROUTE_SCHEME}{rest}"


def member_name(host: str, route_port: int) -> str:
    """A default server name, unique in a cluster: from where the member takes routes."""
    return "vf-" + re.sub(r"[^A-Za-z0-9]+", "-", host).strip("-") + f"-{route_port}"


def check_name(what: str, name: str) -> None:
    """ValueError unless `name` is a server or cluster name nats-server takes as it is."""
    if not _SERVER_NAME.match(name):
        raise ValueError(f"{what} {name!r}: use letters, digits, '.', '_' and '-' only")


def member_config(
    *,
    server_name: str,
    cluster_name: str,
    host: str,
    route_port: int,
    routes: Sequence[str],
    tls: ServerTls | None = None,
) -> str:
    """A server's name and `cluster` block: routes on `host:route_port`, to `routes`.

    `routes` may name this server's own route too (nats-server ignores a route to itself),
    so every member can be given the same list. With `tls`, routes speak TLS only and
    verify each other both ways: each member's certificate must name its route host and
    allow client auth (broker/tls.py).

    Raises:
        ValueError: a bad server or cluster name, or a route that is not a route URL.
    """
    check_name("server name", server_name)
    check_name("cluster name", cluster_name)
    urls = [route_url(r) for r in routes]
    # JSON is nats-server config syntax too: names, URLs and paths are quoted for it.
    route_tls = f"  tls: {json.dumps(tls.route_block())}\n" if tls else ""
    return (
        f"server_name: {json.dumps(server_name)}\n"
        "cluster {\n"
        f"  name: {json.dumps(cluster_name)}\n"
        f"  listen: {json.dumps(host_port(host, route_port))}\n"
        f"  routes: {json.dumps(urls)}\n"
        f"{route_tls}}}\n"
    )


def member_server(
    routes: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 4222,
    store_dir: str | None = None,
    tls: ServerTls | None = None,
    cluster_name: str = "vf",
    route_port: int = DEFAULT_ROUTE_PORT,
    server_name: str | None = None,
) -> NatsServer:
    """One member of a cluster across hosts, not started: clients on `host:port`.

    Its routes listen on `host:route_port` and go to `routes` (see `member_config`); its
    name defaults to one made from its route address (`member_name`), the same at every
    restart, as JetStream needs.

    Raises:
        ValueError: a bad name or route (see `member_config`).
    """
    config = member_config(
        server_name=server_name or member_name(host, route_port),
        cluster_name=cluster_name,
        host=host,
        route_port=route_port,
        routes=routes,
        tls=tls,
    )
    return NatsServer(port=port, store_dir=store_dir, host=host, tls=tls, extra_config=config)


@attrs.define
class LocalCluster:
    """`size` routed nats-servers with JetStream under one temp (or given) directory."""

    size: int = 3
    base_dir: str | None = None
    name: str = "vf"
    # Where every server listens, for clients and routes alike.
    host: str = "127.0.0.1"
    # Appended to every server's config, e.g. `accounts: {...}` from `auth.accounts` (auth on).
    extra_config: str = ""
    # TLS for clients and routes alike: each server presents this certificate to both.
    tls: ServerTls | None = None
    servers: list[NatsServer] = attrs.field(factory=list, init=False)
    # Where each server listens for its peers' routes.
    route_ports: list[int] = attrs.field(factory=list, init=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = attrs.field(default=None, init=False)

    @property
    def urls(self) -> list[str]:
        """Client URLs of every server, running or not."""
        scheme = "tls" if self.tls else "nats"
        return [f"{scheme}://{host_port(self.host, s.port)}" for s in self.servers]

    @property
    def url(self) -> str:
        """All client URLs comma-separated, as BrokerSettings.url takes them."""
        return ",".join(self.urls)

    def start(self) -> LocalCluster:
        """Write the configs and start every server; see `wait_jetstream` for readiness."""
        if self.size < 1:
            raise ServerError(f"cluster size must be >= 1, got {self.size}")
        if self.base_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="vramfabric-cluster-")
            self.base_dir = self._tmp.name
        ports = free_ports(2 * self.size, self.host)
        client_ports, self.route_ports = ports[: self.size], ports[self.size :]
        routes = [f"{_ROUTE_SCHEME}{host_port(self.host, p)}" for p in self.route_ports]
        # JSON is nats-server config syntax too: paths are quoted and escaped for it.
        client_tls = f"tls: {json.dumps(self.tls.client_block())}\n" if self.tls else ""
        for i in range(self.size):
            folder = Path(self.base_dir) / f"n{i}"
            folder.mkdir(parents=True, exist_ok=True)
            config = folder / "server.conf"
            member = member_config(
                server_name=f"n{i}",
                cluster_name=self.name,
                host=self.host,
                route_port=self.route_ports[i],
                routes=routes,
                tls=self.tls,
            )
            listen = json.dumps(host_port(self.host, client_ports[i]))
            config.write_text(
                f"listen: {listen}\njetstream: enabled\n{member}{client_tls}{self.extra_config}"
            )
            self.servers.append(
                NatsServer(
                    port=client_ports[i],
                    store_dir=str(folder / "js"),
                    config_file=str(config),
                    host=self.host,
                    tls=self.tls,
                )
            )
        try:
            for server in self.servers:
                server.start()
        except BaseException:  # re-raised: no server of a half-started cluster is left running
            self.stop()
            raise
        return self

    async def wait_jetstream(
        self, timeout_s: float = 30.0, user: str | None = None, password: str | None = None
    ) -> None:
        """Wait until JetStream answers through the cluster (a meta leader is elected).

        With auth on, `user` and `password` are those of a user with a JetStream account.
        """
        probe = functools.partial(self._account_info, user, password)
        try:
            await CallRetry(deadline_s=timeout_s).call(probe, what="cluster jetstream")
        except TransientError as exc:
            raise ServerError(f"cluster JetStream not ready: {exc}{self._route_failure()}") from exc

    def _route_failure(self) -> str:
        """A server's last word on a route whose TLS handshake failed, or nothing.

        A certificate that does not name the route host or does not allow client auth fails so.
        """
        for server in self.servers:
            with contextlib.suppress(OSError):
                lines = Path(server.log_path).read_text(errors="replace").splitlines()
                failed = [line for line in lines if "TLS route handshake error" in line]
                if failed:
                    return f"; routes refused: {failed[-1].partition('[ERR] ')[2]}"
        return ""

    async def _account_info(self, user: str | None, password: str | None) -> None:
        import nats

        from . import tls

        tls.quiet_closing_noise()
        nc = await nats.connect(
            servers=[u for u, s in zip(self.urls, self.servers, strict=True) if s.pid],
            user=user,
            password=password,
            connect_timeout=1,
            max_reconnect_attempts=1,
            tls=self.tls.probe_context() if self.tls else None,
        )
        try:
            await nc.jetstream().account_info()
        finally:
            await nc.close()

    def kill(self, index: int) -> None:
        """Kill -9 one server (its store stays)."""
        self.servers[index].kill()

    def stop(self) -> None:
        """Stop every server and remove a temp directory."""
        for server in self.servers:
            server.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
