"""A real JupyterHub beside a fabric (tests/hubfabric.py), for the JupyterHub browser test.

The `jupyterhub` package with its DummyAuthenticator, SimpleLocalProcessSpawner (every user
as the user running the tests, root included: `--allow-root`) and configurable-http-proxy
from npm, all on loopback, with `vramfabric.jupyterhub.FabricTenants` as its pre-spawn hook.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import attrs

from tests.hubfabric import Fabric, clean_env, free_port, stop_process

# What chromium needs on this kind of machine, as root and with no network beyond loopback.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium() -> str | None:
    """Debian's chromium, if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def proxy() -> str | None:
    """configurable-http-proxy (npm), on PATH or in this venv's scripts."""
    return shutil.which("configurable-http-proxy", path=clean_env()["PATH"])


def missing_tools() -> str | None:
    """Why the browser test cannot run here (None when it can): what is missing, and how."""
    missing = []
    if chromium() is None:
        missing.append("chromium (apt-get install chromium)")
    if proxy() is None:
        missing.append(
            "configurable-http-proxy (npm install -g --prefix .venv configurable-http-proxy)"
        )
    return ", ".join(missing) or None


def missing_packages() -> str | None:
    """The test extra's packages this environment lacks (pip install '.[test]')."""
    names = ("jupyterhub", "jupyter_server", "playwright")
    lacking = [n for n in names if importlib.util.find_spec(n) is None]
    return ", ".join(lacking) or None


HUB_CONFIG = """
import sys
from vramfabric.jupyterhub import FabricTenants

c = get_config()  # noqa: F821 (JupyterHub's config loader defines it)
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = ["{proxy}"]
c.JupyterHub.db_url = "sqlite:///{folder}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{folder}/home/{{username}}"
c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
c.Spawner.args = ["--allow-root", "--ServerApp.terminals_enabled=False"]
# Each user lands on the course's notebook (a page that logs the browser in to its server).
c.Spawner.default_url = "/view/gpu.ipynb"
c.Spawner.pre_spawn_hook = FabricTenants(
    tenants_file="{tenants_file}", nats_url="{nats_url}", prefix="{prefix}"
)
"""


@attrs.define
class Hub:
    """JupyterHub as a subprocess, configured by HUB_CONFIG; its log in `folder`."""

    folder: Path
    fabric: Fabric
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        """The hub's (and its proxy's and single-user servers') output."""
        return self.folder / "hub.log"

    def home(self, user: str) -> Path:
        """A hub user's home folder (its single-user server's working directory)."""
        return self.folder / "home" / user

    def start(self) -> Hub:
        """Write the config and start the hub (see `wait_ready`)."""
        port = free_port()
        config = HUB_CONFIG.format(
            port=port,
            hub_port=free_port(),
            proxy_api_port=free_port(),
            proxy=proxy(),
            folder=self.folder,
            tenants_file=self.fabric.tenants_file,
            nats_url=self.fabric.url,
            prefix=self.fabric.prefix,
        )
        (self.folder / "jupyterhub_config.py").write_text(config)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", "jupyterhub_config.py"],
                cwd=self.folder,
                env=clean_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{port}"
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until the hub serves (AssertionError with its log if it does not)."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        while b"JupyterHub is now running" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"JupyterHub did not start:\n{self.tail()}")
            time.sleep(0.1)  # polling the hub's log file: there is nothing to await

    def tail(self, n_chars: int = 4000) -> str:
        """The end of the hub's log."""
        return self.log.read_text(errors="replace")[-n_chars:] if self.log.exists() else ""

    def stop(self) -> None:
        """SIGTERM the hub: it stops the single-user servers and the proxy it started."""
        if self.proc is not None:
            stop_process(self.proc, timeout_s=30)


@contextmanager
def barrier() -> Iterator[tuple[str, threading.Event]]:
    """An HTTP URL on loopback whose GET answers only once the event is set (or after 90 s).

    Code on a slice that fetches it holds its slice until the test lets it go.
    """
    release = threading.Event()

    class Wait(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            release.wait(90)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"go")

        def log_message(self, *_args: object) -> None:
            pass  # quiet: the test's output is the hub's log

    server = ThreadingHTTPServer(("127.0.0.1", 0), Wait)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/release", release
    finally:
        release.set()
        server.shutdown()
        server.server_close()
