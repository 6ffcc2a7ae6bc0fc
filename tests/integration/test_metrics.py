"""Every process's metrics pass `promtool check metrics`, and a real Prometheus reads them.

Both tests skip when the Prometheus tools are missing (Debian package `prometheus`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import (
    eventually,
    has_ipv6_loopback,
    interrupt,
    kill_and_close,
    poll_until,
    wait_for_line,
)
from tests.integration.conftest import FabricFactory
from tests.kernels_for_tests import SLEEPY, sleepy_input
from vramfabric.broker import BrokerSettings
from vramfabric.broker.cluster import free_ports
from vramfabric.coordinator import ArgMin, Job
from vramfabric.local import LocalFleet

ROOT = Path(__file__).resolve().parents[2]
# Metric families (counters without `_total`) each side exports, and the other must not.
NODE_SIDE = {"gpu_leases_active", "gpu_vram_allocated_bytes", "gpu_submit", "gpu_submit_errors"}
JOB_SIDE = {"chunks_done", "chunks_retry", "job_leases_held"}


def scrape(url: str) -> str:
    """The text a Prometheus scrape of `url` gets."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        return str(reply.read().decode())


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name{labels}` in an exposition text, if present."""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    prefix = f"{name}{{{inner}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return None


def families(text: str) -> set[str]:
    """The metric family names in an exposition text."""
    return {family.name for family in text_string_to_metric_families(text)}


def promtool_problems(text: str) -> str:
    """What `promtool check metrics` says about an exposition ("" when it is clean)."""
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    return "" if proc.returncode == 0 and not proc.stdout.strip() else proc.stdout + proc.stderr


@pytest.fixture
def fleet(broker: BrokerSettings) -> Iterator[LocalFleet]:
    """One worker process with test kernels, serving metrics on a free port."""
    with LocalFleet(
        workers=1,
        simulate="2x4GiB",
        slice_size="1GiB",
        prefix=broker.prefix,
        url=broker.url,
        node_ttl_s=broker.node_ttl_s,
        worker_args=("--kernel-module", "tests.kernels_for_tests"),
        metrics_port=0,
    ) as started:
        yield started


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_worker_and_run_metrics_pass_promtool_and_count_each_event_on_one_side(
    fleet: LocalFleet, broker: BrokerSettings, tmp_path: Path
) -> None:
    # Given a job file of slow chunks and its inputs
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for i in range(24):
        (inputs / f"{i:03}.bin").write_bytes(sleepy_input(i))
    (tmp_path / "job.toml").write_text(
        'kernel = "sleepy"\naggregate = "argmin"\nslices = 4\n'
        'kernel_modules = ["tests.kernels_for_tests"]\n'
        '[args]\nsleep_s = 0.25\n[inputs]\nglob = "inputs/*.bin"\n'
    )
    env = dict(
        os.environ,
        VRAMFABRIC_NATS_URL=broker.url,
        VRAMFABRIC_PREFIX=broker.prefix,
        VRAMFABRIC_NODE_TTL_S=str(broker.node_ttl_s),
        VRAMFABRIC_SLICE_BYTES="1GiB",
        PYTHONPATH=str(ROOT),
    )
    # When `vramfabric run --metrics-port 0` runs it
    run = subprocess.Popen(
        [sys.executable, "-m", "vramfabric", "run", "job.toml", "--json", "--metrics-port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = wait_for_line(run.stderr, "metrics: http://", timeout_s=30)
        coordinator_url = line.split("metrics: ", 1)[1].strip()
        (worker_url,) = fleet.metrics_urls
        # Then, while it runs, the worker shows the job's leases and the coordinator its progress
        texts: dict[str, str] = {}

        def mid_job() -> bool:
            texts["worker"], texts["coordinator"] = scrape(worker_url), scrape(coordinator_url)
            leases = sample(texts["worker"], "gpu_leases_active", tenant="default")
            done = sample(texts["coordinator"], "chunks_done_total", tenant="default")
            return bool(leases and done)

        assert poll_until(mid_job, timeout_s=60), texts
        out, _err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0 and json.loads(out)["ok"] == 24
    # And promtool finds nothing to complain about in either exposition
    for text in (texts["worker"], texts["coordinator"], scrape(worker_url)):
        assert promtool_problems(text) == ""
    # And each event is counted on one side only, so a sum() over processes adds no double
    worker, coordinator = families(texts["worker"]), families(texts["coordinator"])
    assert worker >= NODE_SIDE and not NODE_SIDE & coordinator
    assert coordinator >= JOB_SIDE and not JOB_SIDE & worker


def prometheus_query(base: str, query: str) -> float | None:
    """The first value of an instant query through Prometheus's HTTP API, if any."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    reply = json.loads(scrape(url))
    result = reply["data"]["result"]
    return float(result[0]["value"][1]) if result else None


@pytest.fixture
def prometheus(fleet: LocalFleet, tmp_path: Path) -> Iterator[str]:
    """A Prometheus server on loopback scraping the fleet's workers every second; its URL."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed")
    targets = [urllib.parse.urlsplit(url).netloc for url in fleet.metrics_urls]
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: vramfabric-workers\n    static_configs: [{{targets: {targets}}}]\n"
    )
    (port,) = free_ports(1)
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        # Ready, and the worker already scraped once: the job starts on a watched fleet.
        assert poll_until(lambda: _up(base), timeout_s=60), "prometheus never scraped the worker"
        yield base
    finally:
        proc.terminate()
        proc.wait(30)


def _up(base: str) -> bool:
    try:
        return prometheus_query(base, 'up{job="vramfabric-workers"}') == 1.0
    except OSError:
        return False  # not listening yet


async def test_prometheus_reads_the_leases_of_a_running_job_then_zero(
    prometheus: str, fabric_factory: FabricFactory
) -> None:
    # Given a Prometheus server scraping the worker every second
    fabric = await fabric_factory()
    job = Job(SLEEPY, [sleepy_input(i) for i in range(64)], args={"sleep_s": 0.5})
    # When a job runs on 4 leases for several seconds
    run = asyncio.create_task(fabric.run(job, ArgMin(), slices=4, timeout_s=120))
    query = 'sum(gpu_leases_active{tenant="default"})'

    async def read(value: float) -> bool:
        got = await asyncio.to_thread(prometheus_query, prometheus, query)
        return got == value

    # Then Prometheus reads the 4 leases back through its HTTP API while the job runs
    await eventually(lambda: read(4.0), timeout_s=60, interval_s=0.5)
    assert not run.done()
    result = await run
    assert result.n_ok == 64 and result.leases_peak == 4
    # And 0 once the job has released them
    await eventually(lambda: read(0.0), timeout_s=30, interval_s=0.5)


def test_up_serves_worker_metrics_on_the_urls_it_prints(tmp_path: Path) -> None:
    # Given `vramfabric up --metrics-port 0` (free ports) in a private runtime dir
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VRAMFABRIC_", "XDG_"))}
    (tmp_path / "run").mkdir(mode=0o700)
    env.update(HOME=str(tmp_path), XDG_RUNTIME_DIR=str(tmp_path / "run"), COLUMNS="1000")
    up = subprocess.Popen(
        [sys.executable, "-m", "vramfabric", "up", "--workers", "2", "--metrics-port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_line(up.stdout, "vramfabric up:", timeout_s=60)
        # When the user scrapes each worker URL it printed
        urls = wait_for_line(up.stderr, "worker metrics:").split()[2:]
        # Then each is a distinct worker's exposition with the node-side lease gauge
        assert len(set(urls)) == 2
        for url in urls:
            assert "gpu_leases_active" in families(scrape(url))
    finally:
        code = interrupt(up)
    assert code == 0


@pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_a_worker_on_an_ipv6_metrics_address_prints_a_url_that_scrapes(
    broker: BrokerSettings,
) -> None:
    # Given a worker told to serve its metrics on ::1 (VRAMFABRIC_METRICS_ADDR)
    env = dict(
        os.environ,
        VRAMFABRIC_NATS_URL=broker.url,
        VRAMFABRIC_PREFIX=broker.prefix,
        VRAMFABRIC_METRICS_ADDR="::1",
    )
    args = ["worker", "--simulate", "1x4GiB", "--node", "v6-metrics", "--metrics-port", "0"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "vramfabric", *args],
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        # When its ready line names the metrics URL (it printed "http://::1:PORT" before,
        # which no client reads as a host and a port)
        line = wait_for_line(worker.stdout, "worker ready", timeout_s=30)
        (url,) = [w[8:] for w in line.split() if w.startswith("metrics=")]
        # Then the URL brackets the address, and scraping it gets the node's exposition
        assert url.startswith("http://[::1]:"), url
        assert "gpu_leases_active" in families(scrape(url))
    finally:
        kill_and_close(worker)
