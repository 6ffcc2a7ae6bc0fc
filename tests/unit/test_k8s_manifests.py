"""deploy/k8s: the rendered manifests are the base and overlays, valid, and say what the code reads.

kubectl is not needed: the overlays' JSON patches are applied here (`build`), the schema comes
with kubernetes-validate, and the flags are parsed by the CLI's own parser. Where kustomize is
on PATH its output is compared too.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from vramfabric.broker import tenants
from vramfabric.broker.server import find_binary
from vramfabric.broker.settings import BrokerSettings
from vramfabric.cli import parse
from vramfabric.coordinator.jobs import jobfile
from vramfabric.coordinator.settings import CoordinatorSettings
from vramfabric.worker.__main__ import STOP_SLACK_S, worker_settings
from vramfabric.worker.node.gpus import check_slice, parse_simulate
from vramfabric.worker.node.settings import WorkerSettings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
OVERLAYS = ("gpu", "simulated")
# The oldest Kubernetes still widely run by GPU clouds, and the newest the package knows.
KUBERNETES_VERSIONS = ("1.29", kubernetes_validate.latest_version())
Doc = dict[str, Any]


def rendered(overlay: str) -> list[Doc]:
    """The documents of deploy/k8s/rendered/<overlay>.yaml."""
    text = (K8S / "rendered" / f"{overlay}.yaml").read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def build(folder: Path) -> list[Doc]:
    """What kustomize makes of `folder`: its resources, then its JSON patches (RFC 6902)."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    # Only what these overlays use: anything else needs a real kustomize to mean the same.
    assert set(spec) <= {"apiVersion", "kind", "resources", "patches"}, sorted(spec)
    docs: list[Doc] = []
    for entry in spec.get("resources", []):
        path = folder / entry
        docs += build(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text())]
    for patch in spec.get("patches", []):
        target = patch["target"]
        [doc] = [
            d
            for d in docs
            if (d["kind"], d["metadata"]["name"]) == (target["kind"], target["name"])
        ]
        for op in yaml.safe_load((folder / patch["path"]).read_text()):
            json_patch(doc, op)
    return docs


def json_patch(doc: Doc, op: Mapping[str, Any]) -> None:
    """Apply one RFC 6902 operation (add, replace or remove) to `doc`, in place."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if op["op"] == "add" and isinstance(node, list):
        node.insert(len(node) if last == "-" else int(last), copy.deepcopy(op["value"]))
    elif op["op"] in ("add", "replace"):
        key = int(last) if isinstance(node, list) else last
        assert op["op"] == "add" or (key in node if isinstance(node, dict) else key < len(node))
        node[key] = copy.deepcopy(op["value"])
    else:
        assert op["op"] == "remove", op
        del node[int(last) if isinstance(node, list) else last]


def named(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    """The documents by (kind, name)."""
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def pod_templates(docs: list[Doc]) -> Iterator[tuple[Doc, Doc]]:
    """(workload, pod template) of each workload."""
    for doc in docs:
        if doc["kind"] in ("StatefulSet", "DaemonSet", "Job"):
            yield doc, doc["spec"]["template"]


def fabric_containers(docs: list[Doc]) -> Iterator[tuple[Doc, Doc]]:
    """(pod template, container) of every container running the vramfabric image."""
    for _, pod in pod_templates(docs):
        for container in pod["spec"]["containers"]:
            if container["image"].split(":")[0] == "vramfabric":
                yield pod, container


def environment(docs: list[Doc], container: Doc) -> dict[str, str]:
    """The variables a container starts with: its ConfigMaps' (envFrom), then its own."""
    maps = named(docs)
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env |= maps["ConfigMap", source["configMapRef"]["name"]]["data"]
    return env | {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


class Reads(Mapping[str, str]):
    """An empty environment that notes each variable looked up in it."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.names.add(name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def variables_read() -> set[str]:
    """Every variable the settings modules look up (nothing listed by hand)."""
    reads = Reads()
    BrokerSettings.from_env(reads)
    WorkerSettings.from_env(reads)
    CoordinatorSettings.from_env(reads)
    return reads.names


def mounted(docs: list[Doc], pod: Doc, container: Doc, path: str) -> str:
    """The text at `path` in the container: a key of the Secret or ConfigMap mounted there."""
    folder, _, key = path.rpartition("/")
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    if "secret" in volume:
        return str(named(docs)["Secret", volume["secret"]["secretName"]]["stringData"][key])
    return str(named(docs)["ConfigMap", volume["configMap"]["name"]]["data"][key])


# The Secret the operator makes (make-tls.sh), and where each side mounts it.
TLS_SECRET = "vramfabric-tls"
TLS_KEYS = ("ca.crt", "tls.crt", "tls.key")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of the files make-tls.sh makes for the Secret (in the namespace `fabric`)."""
    folder = tmp_path_factory.mktemp("tls")
    made = subprocess.run(
        ["sh", str(K8S / "make-tls.sh"), str(folder), "fabric"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    assert all((folder / key).stat().st_size > 0 for key in TLS_KEYS)
    return folder


def secret_keys(pod: Doc, container: Doc, path: str) -> tuple[str, set[str]]:
    """The Secret mounted at `path`'s folder in the container, and the keys it projects there."""
    folder, _, key = path.rpartition("/")
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    keys = {item["key"] for item in secret["items"]} if "items" in secret else set(TLS_KEYS)
    assert all(item["key"] == item["path"] for item in secret.get("items", []))
    assert key in keys and mount["readOnly"], (path, keys)
    return str(secret["secretName"]), keys


def tls_blocks(config: str) -> tuple[dict[str, str], dict[str, str]]:
    """The client `tls { }` block of a nats-server config, and its cluster's (routes')."""
    text = "\n".join(line.split("#")[0] for line in config.splitlines())
    cluster = re.search(r"\ncluster \{(.*)\n\}", text, re.S)
    assert cluster, "no cluster block"
    outside = text[: cluster.start()] + text[cluster.end() :]

    def block(part: str) -> dict[str, str]:
        [body] = re.findall(r"\btls\s*\{([^}]*)\}", part)
        return dict(re.findall(r"(\w+):\s*(\S+)", body))

    return block(outside), block(cluster.group(1))


def pod_env(container: Doc, **given: str) -> dict[str, str]:
    """The container's literal variables, `$(NAME)` references expanded as the kubelet does."""
    env = dict(given)
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], entry["value"])
    return env


def schema_errors(doc: Doc, version: str) -> str:
    """Where and why `doc` does not validate against Kubernetes `version` ("" when it does)."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(part) for part in exc.path)
        return f"{doc['kind']}/{doc['metadata']['name']}: {where}: {exc.message}"
    return ""


def parsed(args: list[str]) -> argparse.Namespace:
    """`args` as `vramfabric` parses them; a failure says which (argparse's error is on stderr)."""
    try:
        return parse(args)
    except SystemExit:
        pass
    pytest.fail(f"`vramfabric {' '.join(args)}`: the CLI refuses these arguments (see stderr)")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_files_are_the_base_with_the_overlays_patches(overlay: str) -> None:
    # Given the base and an overlay, patched here as kustomize patches them
    built = build(K8S / "overlays" / overlay)
    # Then the checked-in rendered file holds exactly those objects (rerun render.sh after edits)
    assert named(rendered(overlay)) == named(built)
    assert len(rendered(overlay)) == len(built)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_files_are_what_kustomize_makes(overlay: str) -> None:
    kustomize = shutil.which("kustomize")
    command = [kustomize, "build"] if kustomize else ["kubectl", "kustomize"]
    if not kustomize and not shutil.which("kubectl"):
        pytest.skip("neither kustomize nor kubectl on PATH (the patches are checked above)")
    out = subprocess.run(
        [*command, str(K8S / "overlays" / overlay)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert [d for d in yaml.safe_load_all(out.stdout) if d] == rendered(overlay)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_document_validates_against_the_kubernetes_schema(
    overlay: str, version: str
) -> None:
    for doc in rendered(overlay):
        # strict: a field the schema does not know (a typo) fails too
        assert not schema_errors(doc, version)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_fabric_containers_pass_only_flags_and_variables_the_code_reads(
    overlay: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tls_files: Path
) -> None:
    docs, known = rendered(overlay), variables_read()
    containers = list(fabric_containers(docs))
    assert {c["args"][0] for _, c in containers} == {"worker", "run"}
    for pod, container in containers:
        # Given a container's environment, and no other VRAMFABRIC_ variable
        env = environment(docs, container)
        assert set(env) <= known, sorted(set(env) - known)
        for name in [n for n in os.environ if n.startswith("VRAMFABRIC_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        # (the CA file the Secret mounts there: one make-tls.sh made, here)
        monkeypatch.setenv("VRAMFABRIC_TLS_CA", str(tls_files / "ca.crt"))
        # When its arguments are parsed by the CLI (the image's entry point is `vramfabric`)
        assert "command" not in container
        args = parsed(container["args"])
        # Then the settings it starts with parse too, and it serves metrics where scraped
        BrokerSettings.from_env()
        port = pod["metadata"]["annotations"]["prometheus.io/port"]
        assert str(args.metrics_port) == port
        assert int(port) in {p["containerPort"] for p in container["ports"]}
        if args.command == "worker":
            settings = worker_settings(args)
            if settings.simulate:
                check_slice(parse_simulate(settings.simulate), settings.slice_bytes)
            assert pod["spec"]["terminationGracePeriodSeconds"] > (
                settings.drain_grace_s + STOP_SLACK_S
            )
            assert settings.tenants_file is not None
            policy = mounted(docs, pod, container, settings.tenants_file)
            assert tenants.parse_policy(tomllib.loads(policy)).tenants
        else:
            CoordinatorSettings.from_env()
            (tmp_path / "job.toml").write_text(mounted(docs, pod, container, args.jobfile))
            job = jobfile.load(tmp_path / "job.toml").job
            assert getattr(job.kernel, "name", None) == "hyperparam_eval"


def server_names(docs: list[Doc]) -> list[str]:
    """Each server of the StatefulSet by the name clients and peers reach it: NAME-i.SERVICE."""
    nats = named(docs)["StatefulSet", "nats"]
    name, service = nats["metadata"]["name"], nats["spec"]["serviceName"]
    return [f"{name}-{i}.{service}" for i in range(nats["spec"]["replicas"])]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_clients_reach_every_nats_server_over_tls_and_streams_have_their_replicas(
    overlay: str, tls_files: Path
) -> None:
    docs = rendered(overlay)
    nats = named(docs)["StatefulSet", "nats"]
    # Given the StatefulSet's servers, each NAME-i.SERVICE on the client port, over TLS
    servers = [f"tls://{name}:4222" for name in server_names(docs)]
    # Then every fabric container connects to all of them, TLS only, and makes R3 streams
    for pod, container in fabric_containers(docs):
        env = environment(docs, container)
        # verifying them with the CA, the only key of the TLS Secret mounted in its pod
        ca_path = env["VRAMFABRIC_TLS_CA"]
        assert secret_keys(pod, container, ca_path) == (TLS_SECRET, {"ca.crt"})
        settings = BrokerSettings.from_env(env | {"VRAMFABRIC_TLS_CA": str(tls_files / "ca.crt")})
        assert settings.servers == servers
        assert settings.tls_required and settings.tls is not None
        assert settings.replicas == nats["spec"]["replicas"]
    # And the servers' config routes to each other
    config = named(docs)["ConfigMap", "nats-config"]["data"]["nats.conf"]
    assert all(f"nats-route://{name}:6222" in config for name in server_names(docs))


def test_nats_servers_require_tls_for_clients_and_routes_from_the_secret() -> None:
    docs = rendered("gpu")
    config = named(docs)["ConfigMap", "nats-config"]["data"]["nats.conf"]
    [(pod, container)] = [
        (p, c)
        for _, p in pod_templates(docs)
        for c in p["spec"]["containers"]
        if c["name"] == "nats"
    ]
    # Given the client block and the routes' block of the servers' config
    client, route = tls_blocks(config)
    # Then both present the Secret's certificate and verify peers with its CA, as mounted
    for block in (client, route):
        assert "verify" not in block  # clients present no certificate; routes verify anyway
        for field, key in (
            ("cert_file", "tls.crt"),
            ("key_file", "tls.key"),
            ("ca_file", "ca.crt"),
        ):
            assert block[field].endswith(f"/{key}")
            assert secret_keys(pod, container, block[field]) == (TLS_SECRET, set(TLS_KEYS))
    # And each server tells clients and peers the name its certificate carries, not its IP
    env = pod_env(container, POD_NAME="nats-1")
    assert "client_advertise: $CLIENT_ADVERTISE" in config
    assert "advertise: $CLUSTER_ADVERTISE" in config
    assert env["CLIENT_ADVERTISE"] == "nats-1.nats:4222"
    assert env["CLUSTER_ADVERTISE"] == "nats-1.nats:6222"


def test_make_tls_makes_a_certificate_every_client_and_peer_accepts(tls_files: Path) -> None:
    # Given the files make-tls.sh made (namespace `fabric`)
    ca, cert = str(tls_files / "ca.crt"), str(tls_files / "tls.crt")
    # Then the certificate, signed by the CA, names every server as clients and routes reach
    # it, and serves both ends of a route (peers present it as a client's)
    for short in server_names(rendered("gpu")):
        for name in (short, f"{short}.fabric.svc.cluster.local"):
            for purpose in ("sslserver", "sslclient"):
                out = subprocess.run(
                    ["openssl", "verify", "-CAfile", ca, "-purpose", purpose,
                     "-verify_hostname", name, cert],
                    capture_output=True, text=True, timeout=30,
                )  # fmt: skip
                assert out.returncode == 0, (name, purpose, out.stdout + out.stderr)
    # And no other name
    other = subprocess.run(
        ["openssl", "verify", "-CAfile", ca, "-verify_hostname", "nats-3.nats", cert],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert other.returncode != 0


def test_nats_config_passes_nats_servers_check(tmp_path: Path, tls_files: Path) -> None:
    # Given the servers' config, as a pod of the StatefulSet sees it, with make-tls.sh's files
    # where the Secret is mounted
    docs = rendered("gpu")
    config = named(docs)["ConfigMap", "nats-config"]["data"]["nats.conf"]
    (tmp_path / "nats.conf").write_text(config.replace("/etc/nats-tls", str(tls_files)))
    [container] = [
        c for _, p in pod_templates(docs) for c in p["spec"]["containers"] if c["name"] == "nats"
    ]
    env = {"PATH": os.environ["PATH"], **pod_env(container, POD_NAME="nats-0")}
    # When nats-server tests it (-t: parse only, nothing started)
    out = subprocess.run(
        [find_binary(), "-t", "-c", str(tmp_path / "nats.conf")],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    # Then it is valid: no unknown field, every variable found
    assert out.returncode == 0, out.stdout + out.stderr


def test_gpu_workers_ask_for_gpus_on_gpu_nodes_and_simulated_ones_do_not() -> None:
    gpu = named(rendered("gpu"))["DaemonSet", "vramfabric-worker"]["spec"]["template"]["spec"]
    sim = named(rendered("simulated"))["DaemonSet", "vramfabric-worker"]["spec"]["template"]["spec"]
    # GPU nodes: the NVIDIA runtime, GPUs from the device plugin, tolerating the GPU taint
    assert gpu["runtimeClassName"] == "nvidia"
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert gpu["containers"][0]["image"] == "vramfabric:gpu"
    assert any(t["key"] == "nvidia.com/gpu" for t in gpu["tolerations"])
    assert gpu["nodeSelector"]
    assert "--simulate" not in gpu["containers"][0]["args"]
    # Simulated: any node, no GPU asked for
    assert "--simulate" in sim["containers"][0]["args"]
    assert not {"runtimeClassName", "nodeSelector", "tolerations"} & set(sim)
    assert "limits" not in sim["containers"][0]["resources"]
