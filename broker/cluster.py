"""LocalCluster: three (or more) nats-servers with routes on loopback, for R3 streams.

Used by the chaos tests and by `vramfabric server --cluster 3`. Each server keeps its own
store, so a killed one restarts with its data and catches up from the others.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import tempfile
from pathlib import Path

import attrs

from .errors import ServerError, TransientError
from .retrying import CallRetry
from .server import NatsServer
from .tls import ServerTls

_CONFIG = """\
server_name: {name}
listen: 127.0.0.1:{port}
jetstream: enabled
cluster {{
  name: {cluster}
  listen: 127.0.0.1:{route_port}
  routes: [{routes}]
{route_tls}}}
{client_tls}"""


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports (bound and released at once; a race is unlikely)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


@attrs.define
class LocalCluster:
    """`size` routed nats-servers with JetStream under one temp (or given) directory."""

    size: int = 3
    base_dir: str | None = None
    name: str = "vf"
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
        return [f"{scheme}://127.0.0.1:{s.port}" for s in self.servers]

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
        ports = free_ports(2 * self.size)
        client_ports, self.route_ports = ports[: self.size], ports[self.size :]
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.route_ports)
        # JSON is nats-server config syntax too: paths are quoted and escaped for it.
        route_tls = f"  tls: {json.dumps(self.tls.route_block())}\n" if self.tls else ""
        client_tls = f"tls: {json.dumps(self.tls.client_block())}\n" if self.tls else ""
        for i in range(self.size):
            folder = Path(self.base_dir) / f"n{i}"
            folder.mkdir(parents=True, exist_ok=True)
            config = folder / "server.conf"
            config.write_text(
                _CONFIG.format(
                    name=f"n{i}",
                    port=client_ports[i],
                    cluster=self.name,
                    route_port=self.route_ports[i],
                    routes=routes,
                    route_tls=route_tls,
                    client_tls=client_tls,
                )
                + self.extra_config
            )
            self.servers.append(
                NatsServer(
                    port=client_ports[i],
                    store_dir=str(folder / "js"),
                    config_file=str(config),
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

        A certificate that does not name 127.0.0.1 or does not allow client auth fails so.
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
