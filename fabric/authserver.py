"""AuthServer: nats-server run with a tenants file's config, reloaded when the file changes.

The generated config (broker/auth.py) holds one account per tenant. After each change the
new tenants' streams are provisioned and the workers' policy file is rewritten in place
(workers read it again when it changes). A file that does not parse changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from pathlib import Path

import attrs

from vramfabric.broker import auth, tenants
from vramfabric.broker.server import NatsServer
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.tls import ServerTls

log = logging.getLogger(__name__)

# How long a start waits for the server: a base, and more for each tenant's account.
_READY_S = 10.0
_READY_S_PER_TENANT = 0.1


@attrs.define
class AuthServer:
    """An embedded server with auth on, its generated config and the workers' policy file."""

    tenants_path: Path
    broker: BrokerSettings
    # The operator's plain password: it provisions the fabric's and every tenant's account.
    operator_password: str
    port: int = -1
    store_dir: str | None = None
    # Clients must use TLS (the config's `tls` block); None: plain TCP.
    tls: ServerTls | None = None
    # The address it listens on (`vramfabric server --host`).
    host: str = "127.0.0.1"
    _server: NatsServer | None = attrs.field(default=None, init=False)
    _folder: Path | None = attrs.field(default=None, init=False)
    _stamp: tenants.FileStamp | None = attrs.field(default=None, init=False)
    _names: set[str] = attrs.field(factory=set, init=False)

    @property
    def server(self) -> NatsServer:
        """The running server."""
        if self._server is None:
            raise RuntimeError("AuthServer not started")
        return self._server

    @property
    def folder(self) -> Path:
        """Where the generated config and the policy file are (removed on stop)."""
        if self._folder is None:
            raise RuntimeError("AuthServer not started")
        return self._folder

    @property
    def policy_file(self) -> Path:
        """The workers' policy file (no credentials), beside the config."""
        return self.folder / "policy.toml"

    def start(self) -> AuthServer:
        """Write the config and the policy, start the server and provision every account."""
        file = self._load()
        self._names = {t.name for t in file.tenants}
        self._folder = Path(tempfile.mkdtemp(prefix="vramfabric-auth-"))
        config = self._write(file)
        # The config grows with the tenants, and nats-server reads it before it logs a line:
        # 500 tenants' 5.8 MB took 4.0 s to become ready on a quiet 2-core VM, over 10 s on a
        # busy one. A restart (a tenant added) waits as long.
        self._server = NatsServer(
            config_file=str(config),
            store_dir=self.store_dir,
            ready_timeout_s=_ready_s(len(file.tenants)),
            tls=self.tls,
            host=self.host,
        )
        try:
            self._server.start()
            self._provision(file)
        except BaseException:  # re-raised: a half-started server is stopped first
            self.stop()
            raise
        return self

    def changed(self) -> bool:
        """Whether the tenants file was written since it was last read."""
        stamp = tenants.file_stamp(self.tenants_path)
        # None: moved away for a moment (an editor's save): keep what we have.
        return stamp is not None and stamp != self._stamp

    def reload(self) -> int:
        """Read the tenants file again and apply it; the number of tenants now.

        Passwords, quotas, weights and code flags change live (SIGHUP). A tenant added or
        removed restarts the server on its port and store (a second or so; clients
        reconnect, nothing stored is lost): nats-server 2.15 takes a new account on SIGHUP
        but does not wire its imports (nats-io/nats-server#8560), so it could not lease.

        Raises:
            ValueError: the file does not parse or check; the running config is kept.
        """
        file = self._load()
        names = {t.name for t in file.tenants}
        self._write(file)
        if names == self._names:
            self.server.reload()
        else:
            log.info("tenants added or removed: restarting nats-server url=%s", self.server.url)
            self.server.ready_timeout_s = _ready_s(len(file.tenants))
            self.server.restart()
        added, self._names = names - self._names, names
        # Only the new accounts need streams: with 500 tenants, provisioning them all again
        # took 11 s a reload, while every client waited on a server that would not answer.
        self._provision(file, added)
        log.info("tenants reloaded tenants=%d", len(file.tenants))
        return len(file.tenants)

    def stop(self) -> None:
        """Stop the server and remove the generated config (it holds every password)."""
        if self._server is not None:
            self._server.stop()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def _load(self) -> tenants.TenantsFile:
        # Noted before parsing: a bad file is reported once, and read again when written again.
        self._stamp = tenants.file_stamp(self.tenants_path) or self._stamp
        return tenants.load(self.tenants_path)

    def _write(self, file: tenants.TenantsFile) -> Path:
        # Same listen port every time: nats-server cannot change it on a reload.
        text = auth.server_config(
            file, self.broker.subjects, host=self.host, port=self.port, tls=self.tls
        )
        config = auth.write_private(self.folder / "server.json", text)
        tenants.write_policy(file.policy, self.policy_file)
        return config

    def _provision(self, file: tenants.TenantsFile, only: set[str] | None = None) -> None:
        broker = attrs.evolve(self.broker, url=self.server.url)
        if self.tls is not None and broker.tls is None:
            # Its own server: checked with the CA it was given, as a route peer checks it.
            broker = attrs.evolve(broker, tls=self.tls.probe_context())
        operator = auth.settings_for(
            broker,
            tenants.OPERATOR_USER,
            self.operator_password,
        )
        # Idempotent: existing streams are kept; a reload's new accounts get theirs.
        asyncio.run(auth.provision_tenants(operator, file, only))


def _ready_s(n_tenants: int) -> float:
    """How long a start or restart waits for a server of `n_tenants` accounts."""
    return _READY_S + _READY_S_PER_TENANT * n_tenants
