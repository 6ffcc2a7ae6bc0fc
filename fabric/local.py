"""LocalFleet: an embedded nats-server plus simulated worker subprocesses on this machine.

Used by `vramfabric up` and `demo`, the benchmarks and the end-to-end tests. Children get
PR_SET_PDEATHSIG, so killing the parent, even with -9, leaves no process behind.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import attrs

from vramfabric.broker.errors import ServerError
from vramfabric.broker.server import NatsServer, die_with_parent
from vramfabric.broker.settings import BrokerSettings, parse_size

if TYPE_CHECKING:
    # Imported where a tenants file is used: `vramfabric up` without one starts sooner.
    from vramfabric.broker import tenants

    from .forked import ForkedWorker

    # A worker process: spawned (its own interpreter), or forked from this one.
    WorkerProcess: TypeAlias = subprocess.Popen[bytes] | ForkedWorker

_READY_LINE = b"worker ready"


@attrs.define
class LocalFleet:
    """Start with `start()`, stop with `stop()`; `broker` points clients at the server."""

    workers: int = 2
    simulate: str = "4x80GiB"
    slice_size: str = "512MiB"
    prefix: str = "vf"
    url: str | None = None  # an existing server; None starts an embedded one
    node_ttl_s: float = 5.0
    replicas: int = 1
    worker_args: tuple[str, ...] = ()
    verbose: bool = False
    port: int = -1  # of the embedded server; -1 picks a free one
    # Workers serve metrics when set: on this port plus their index, or each on a free port if 0.
    metrics_port: int | None = None
    # A tenants file with plain passwords: the embedded server then runs with auth on; with
    # `url` set, the server there must run with this file's config (workers use its users).
    tenants_file: str | None = None
    # Workers forked from this process, which imports their modules once (fabric/forked.py):
    # only for a process with no thread, no event loop and no secret (`vramfabric up`).
    fork: bool = False
    server: NatsServer | None = attrs.field(default=None, init=False)
    procs: list[WorkerProcess] = attrs.field(factory=list, init=False)
    # The `/metrics` URL of every ready worker that serves one.
    metrics_urls: list[str] = attrs.field(factory=list, init=False)
    _tenants: tenants.TenantsFile | None = attrs.field(default=None, init=False)
    _config_dir: tempfile.TemporaryDirectory[str] | None = attrs.field(default=None, init=False)

    @property
    def broker(self) -> BrokerSettings:
        """Settings for clients of this fleet (the operator's, when auth is on)."""
        url = self.url or (self.server.url if self.server else "")
        base = BrokerSettings(
            url=url, prefix=self.prefix, node_ttl_s=self.node_ttl_s, replicas=self.replicas
        )
        if self._tenants is None:
            return base
        # With its NATS client: only when auth is on.
        from vramfabric.broker import auth, tenants

        return auth.settings_for(base, tenants.OPERATOR_USER, self._tenants.operator.password)

    def broker_for(self, tenant: str) -> BrokerSettings:
        """Settings of one tenant's clients (the plain settings when auth is off)."""
        if self._tenants is None:
            return self.broker
        password = self._tenants.tenant(tenant).credential.password
        from vramfabric.broker import auth

        return auth.settings_for(self.broker, tenant, password)

    @property
    def policy_file(self) -> Path:
        """The tenants' policy file workers read (no credentials); auth on only."""
        assert self._config_dir is not None, "no tenants file"
        return Path(self._config_dir.name) / "policy.toml"

    def start(self, ready_timeout_s: float = 30.0) -> LocalFleet:
        """Start the server (unless `url` is set) and the workers; wait until all serve."""
        from vramfabric.worker.node.gpus import check_slice, parse_simulate

        # Said here, before anything starts: a worker's own refusal would only show as its
        # exit code (its stderr is not kept unless `verbose`).
        check_slice(parse_simulate(self.simulate), parse_size(self.slice_size))
        if self.fork and self.tenants_file is not None:
            # A forked worker would hold a copy of every password this process read.
            raise ValueError("forked workers take no tenants file: spawn them instead")
        if self.tenants_file is not None:
            from vramfabric.broker import tenants

            self._tenants = tenants.load(self.tenants_file)
            self._config_dir = tempfile.TemporaryDirectory(prefix="vramfabric-auth-")
            # Workers get the policy alone: tenants' code on a node never finds a password.
            tenants.write_policy(self._tenants.policy, self.policy_file)
        try:
            if self.fork:
                from vramfabric.worker.__main__ import preload

                if self.url is None:
                    # Launched first, it comes up while this process imports the workers'.
                    self.server = NatsServer(port=self.port).launch()
                preload()
            if self.server is not None:
                self.server.wait_ready()
            elif self.url is None:
                self.server = self._start_server()
            for i in range(self.workers):
                self.procs.append(self.spawn_worker(f"local-{i}"))
            for proc in self.procs:
                self._wait_ready(proc, ready_timeout_s)
        except BaseException:  # re-raised: a half-started fleet is stopped first
            self.stop()
            raise
        return self

    def _start_server(self) -> NatsServer:
        """An embedded server; with a tenants file, started with its config and provisioned."""
        if self.tenants_file is None:
            return NatsServer(port=self.port).start()
        assert self._tenants is not None
        assert self._config_dir is not None
        import asyncio

        from vramfabric.broker import auth

        config = Path(self._config_dir.name) / "server.json"
        auth.write_config(
            self._tenants, BrokerSettings(prefix=self.prefix).subjects, config, port=self.port
        )
        server = NatsServer(config_file=str(config)).start()
        self.server = server
        asyncio.run(auth.provision_tenants(self.broker, self._tenants))
        return server

    def spawn_worker(self, node: str, extra_args: tuple[str, ...] = ()) -> WorkerProcess:
        """Start one worker subprocess with simulated GPUs (not waited for)."""
        env = dict(
            os.environ,
            VRAMFABRIC_NATS_URL=self.broker.url,
            VRAMFABRIC_PREFIX=self.prefix,
            VRAMFABRIC_NODE_TTL_S=str(self.node_ttl_s),
            VRAMFABRIC_REPLICAS=str(self.replicas),
        )
        if self._tenants is not None and self.tenants_file is not None:
            from vramfabric.broker import tenants

            # Credentials travel in the environment, never on a command line.
            env.update(
                VRAMFABRIC_NATS_USER=tenants.WORKERS_USER,
                VRAMFABRIC_NATS_PASSWORD=self._tenants.workers.password or "",
                VRAMFABRIC_TENANTS=str(self.policy_file),
            )
        argv = [
            "--simulate",
            self.simulate,
            "--slice",
            self.slice_size,
            "--node",
            node,
            *self.worker_args,
            *extra_args,
        ]
        if "--allow-code" in argv:
            # A local fabric runs its one user's own code: where executors cannot get uids of
            # their own (a root Python in /root), that code runs as the worker, as allowed here.
            argv.append("--allow-shared-uid")
        if self.metrics_port is not None:
            port = self.metrics_port and self.metrics_port + len(self.procs)
            argv += ["--metrics-port", str(port)]
        if self.verbose:
            argv.append("-v")
        if self.fork:
            from .forked import ForkedWorker

            return ForkedWorker.start(argv, env, quiet=not self.verbose)
        return subprocess.Popen(
            [sys.executable, "-m", "vramfabric.worker", *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=None if self.verbose else subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )

    def add_worker(
        self, node: str, extra_args: tuple[str, ...] = (), ready_timeout_s: float = 30.0
    ) -> WorkerProcess:
        """Start one more worker, wait until it serves, and keep it for `stop()`."""
        proc = self.spawn_worker(node, extra_args)
        self.procs.append(proc)
        self._wait_ready(proc, ready_timeout_s)
        return proc

    def _wait_ready(self, proc: WorkerProcess, timeout_s: float) -> None:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServerError(f"worker exited with code {proc.returncode} before it was ready")
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            line = proc.stdout.readline() if ready else b""
            if _READY_LINE in line:
                # "worker ready node=N metrics=URL": the URL names the port a 0 turned into.
                self.metrics_urls += [w[8:] for w in line.decode().split() if w[:8] == "metrics="]
                return
        raise ServerError(f"worker not ready within {timeout_s}s")

    def stop(self, timeout_s: float = 15.0) -> list[int]:
        """SIGTERM every worker (they drain and release), then stop the server.

        Returns the workers' exit codes.
        """
        codes = []
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout_s))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
            if proc.stdout is not None:
                proc.stdout.close()
        self.procs.clear()
        self.metrics_urls.clear()
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self._config_dir is not None:
            self._config_dir.cleanup()
            self._config_dir = None
        return codes

    def __enter__(self) -> LocalFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def demo_tenants_file(
    path: str | Path, names: tuple[str, ...] = ("demo",), allow_code: bool = False
) -> Path:
    """Write a tenants file with fresh random passwords (weight 1, no quota; code if asked)."""
    import secrets

    from vramfabric.broker import auth

    code = "\nallow_code = true" if allow_code else ""
    lines = [f'[operator]\npassword = "{secrets.token_hex(16)}"']
    lines.append(f'[workers]\npassword = "{secrets.token_hex(16)}"')
    lines += [f'[tenants.{n}]\npassword = "{secrets.token_hex(16)}"{code}' for n in names]
    return auth.write_private(path, "\n".join(lines) + "\n")
