"""BrokerSettings, WorkerSettings and CoordinatorSettings read from explicit environments."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramfabric.broker.messages import MAX_LEASE_COUNT
from vramfabric.broker.settings import DEFAULT_URL, BrokerSettings
from vramfabric.broker.subjects import token
from vramfabric.coordinator.settings import CoordinatorSettings
from vramfabric.worker.node.settings import WorkerSettings


@pytest.fixture(autouse=True)
def _no_local_fabric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A home of its own: a `vramfabric up` of this user (found there) is no default here."""
    monkeypatch.setenv("HOME", str(tmp_path))


# --- BrokerSettings ----------------------------------------------------------------------


def test_broker_defaults_from_an_empty_environment() -> None:
    s = BrokerSettings.from_env({})
    assert s == BrokerSettings()
    assert s.url == DEFAULT_URL == "nats://127.0.0.1:4222"
    assert (s.prefix, s.replicas, s.node_ttl_s) == ("vf", 1, 5.0)
    assert (s.user, s.password, s.creds_file) == (None, None, None)
    assert (s.connect_timeout_s, s.request_timeout_s) == (2.0, 2.0)


def test_broker_empty_values_keep_defaults() -> None:
    env = {
        "VRAMFABRIC_NATS_URL": "",
        "VRAMFABRIC_PREFIX": "",
        "VRAMFABRIC_REPLICAS": "",
        "VRAMFABRIC_NODE_TTL_S": "",
        "VRAMFABRIC_NATS_USER": "",
    }
    assert BrokerSettings.from_env(env) == BrokerSettings()


def test_broker_overrides() -> None:
    env = {
        "VRAMFABRIC_NATS_URL": "nats://a:4222, nats://b:4222,",
        "VRAMFABRIC_PREFIX": "t1",
        "VRAMFABRIC_NATS_USER": "u",
        "VRAMFABRIC_NATS_PASSWORD": "p",
        "VRAMFABRIC_NATS_CREDS": "/x.creds",
        "VRAMFABRIC_REPLICAS": "3",
        "VRAMFABRIC_CONNECT_TIMEOUT_S": "0.5",
        "VRAMFABRIC_REQUEST_TIMEOUT_S": "7",
        "VRAMFABRIC_NODE_TTL_S": "2.5",
    }
    s = BrokerSettings.from_env(env)
    assert s.servers == ["nats://a:4222", "nats://b:4222"]
    assert (s.prefix, s.user, s.password, s.creds_file) == ("t1", "u", "p", "/x.creds")
    assert (s.replicas, s.connect_timeout_s, s.request_timeout_s, s.node_ttl_s) == (
        3,
        0.5,
        7.0,
        2.5,
    )
    assert s.subjects.prefix == "t1"
    assert s.subjects.node_advert("n") == "t1.node.n.advert"


@pytest.mark.parametrize(
    "name",
    [
        "VRAMFABRIC_REPLICAS",
        "VRAMFABRIC_CONNECT_TIMEOUT_S",
        "VRAMFABRIC_REQUEST_TIMEOUT_S",
        "VRAMFABRIC_NODE_TTL_S",
    ],
)
def test_broker_bad_numbers_name_the_variable(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}='lots' is not an? "):
        BrokerSettings.from_env({name: "lots"})


def test_broker_replicas_must_be_an_integer() -> None:
    with pytest.raises(ValueError, match=r"VRAMFABRIC_REPLICAS='3\.0' is not an integer"):
        BrokerSettings.from_env({"VRAMFABRIC_REPLICAS": "3.0"})


@pytest.mark.parametrize("replicas", ["2", "0", "4"])
def test_broker_replicas_must_be_1_3_or_5(replicas: str) -> None:
    with pytest.raises(ValueError, match="replicas"):
        BrokerSettings.from_env({"VRAMFABRIC_REPLICAS": replicas})


def test_broker_node_ttl_below_a_second_is_rejected() -> None:
    with pytest.raises(ValueError, match="node_ttl_s"):
        BrokerSettings.from_env({"VRAMFABRIC_NODE_TTL_S": "0.5"})


@pytest.mark.parametrize("prefix", ["a.b", "a b", "*", ">", "vf\t", "VF", "Vf"])
def test_broker_bad_prefix_is_rejected(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        BrokerSettings.from_env({"VRAMFABRIC_PREFIX": prefix})


# --- WorkerSettings ----------------------------------------------------------------------


def test_worker_defaults_from_an_empty_environment() -> None:
    s = WorkerSettings.from_env({})
    assert s.simulate is None
    assert s.slice_bytes == 512 * 2**20
    assert (s.heartbeat_s, s.max_ttl_s, s.drain_grace_s) == (1.0, 600.0, 10.0)
    assert (s.turn_s, s.service_halflife_s, s.lease_queue) == (30.0, 60.0, 64)
    assert s.metrics_port is None
    assert token(s.node) == s.node


def test_worker_default_node_names_are_unique_per_process_instance() -> None:
    assert WorkerSettings.from_env({}).node != WorkerSettings.from_env({}).node


def test_worker_overrides() -> None:
    env = {
        "VRAMFABRIC_NODE": "gpu-box-1",
        "VRAMFABRIC_SIMULATE": "4x48GiB",
        "VRAMFABRIC_SLICE": "512MiB",
        "VRAMFABRIC_METRICS_PORT": "9100",
        "VRAMFABRIC_HEARTBEAT_S": "0.25",
        "VRAMFABRIC_MAX_TTL_S": "120",
        "VRAMFABRIC_DRAIN_GRACE_S": "0",
        "VRAMFABRIC_TURN_S": "5",
        "VRAMFABRIC_SERVICE_HALFLIFE_S": "20",
        "VRAMFABRIC_LEASE_QUEUE": "8",
    }
    s = WorkerSettings.from_env(env)
    assert (s.turn_s, s.service_halflife_s, s.lease_queue) == (5.0, 20.0, 8)
    assert (s.node, s.simulate, s.slice_bytes, s.metrics_port) == (
        "gpu-box-1",
        "4x48GiB",
        512 * 2**20,
        9100,
    )
    assert (s.heartbeat_s, s.max_ttl_s, s.drain_grace_s) == (0.25, 120.0, 0.0)


@pytest.mark.parametrize(
    "name", ["VRAMFABRIC_HEARTBEAT_S", "VRAMFABRIC_MAX_TTL_S", "VRAMFABRIC_DRAIN_GRACE_S"]
)
def test_worker_bad_numbers_name_the_variable(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}='soon' is not a number"):
        WorkerSettings.from_env({name: "soon"})


def test_worker_bad_metrics_port_names_the_variable() -> None:
    with pytest.raises(ValueError, match="VRAMFABRIC_METRICS_PORT='http' is not an integer"):
        WorkerSettings.from_env({"VRAMFABRIC_METRICS_PORT": "http"})


def test_worker_bad_slice_is_rejected() -> None:
    with pytest.raises(ValueError, match="not a size: 'lots'"):
        WorkerSettings.from_env({"VRAMFABRIC_SLICE": "lots"})


@pytest.mark.parametrize(
    ("cls", "name"),
    [("worker", "VRAMFABRIC_SLICE"), ("coordinator", "VRAMFABRIC_SLICE_BYTES")],
)
def test_bad_slice_size_names_the_variable(cls: str, name: str) -> None:
    settings = WorkerSettings if cls == "worker" else CoordinatorSettings
    with pytest.raises(ValueError, match=name):
        settings.from_env({name: "lots"})


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"VRAMFABRIC_HEARTBEAT_S": "0"}, "heartbeat_s"),
        ({"VRAMFABRIC_MAX_TTL_S": "-1"}, "max_ttl_s"),
        ({"VRAMFABRIC_DRAIN_GRACE_S": "-0.5"}, "drain_grace_s"),
        ({"VRAMFABRIC_SLICE": "0"}, "size must be positive"),
    ],
)
def test_worker_out_of_range_values_are_rejected(env: dict[str, str], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        WorkerSettings.from_env(env)


@pytest.mark.parametrize("node", ["gpu.box", "gpu box", "*"])
def test_worker_bad_node_name_is_rejected(node: str) -> None:
    with pytest.raises(ValueError, match="node"):
        WorkerSettings.from_env({"VRAMFABRIC_NODE": node})


# --- CoordinatorSettings -----------------------------------------------------------------


def test_coordinator_defaults_from_an_empty_environment() -> None:
    s = CoordinatorSettings.from_env({})
    assert s == CoordinatorSettings()
    assert (s.tenant, s.slice_bytes, s.lease_ttl_s, s.placement) == (
        "default",
        512 * 2**20,
        30.0,
        "spread",
    )
    assert (s.max_slices, s.ack_wait_s) == (1000, 30.0)


def test_coordinator_overrides() -> None:
    env = {
        "VRAMFABRIC_TENANT": "acme",
        "VRAMFABRIC_SLICE_BYTES": "1048576",
        "VRAMFABRIC_LEASE_TTL_S": "12.5",
        "VRAMFABRIC_PLACEMENT": "pack",
        "VRAMFABRIC_MAX_SLICES": "64",
        "VRAMFABRIC_ACK_WAIT_S": "5",
    }
    s = CoordinatorSettings.from_env(env)
    assert (s.tenant, s.slice_bytes, s.lease_ttl_s, s.placement) == ("acme", 2**20, 12.5, "pack")
    assert (s.max_slices, s.ack_wait_s) == (64, 5.0)


@pytest.mark.parametrize(("text", "n_bytes"), [("1GiB", 2**30), ("256MiB", 2**28), ("4096", 4096)])
def test_coordinator_slice_bytes_accepts_sizes(text: str, n_bytes: int) -> None:
    assert CoordinatorSettings.from_env({"VRAMFABRIC_SLICE_BYTES": text}).slice_bytes == n_bytes


@pytest.mark.parametrize(
    ("name", "value", "kind"),
    [
        ("VRAMFABRIC_MAX_SLICES", "many", "integer"),
        ("VRAMFABRIC_LEASE_TTL_S", "long", "number"),
        ("VRAMFABRIC_ACK_WAIT_S", "x", "number"),
    ],
)
def test_coordinator_bad_numbers_name_the_variable(name: str, value: str, kind: str) -> None:
    with pytest.raises(ValueError, match=f"{name}={value!r} is not an? {kind}"):
        CoordinatorSettings.from_env({name: value})


@pytest.mark.parametrize("tenant", ["a.b", "a b", ">", "acme*"])
def test_coordinator_bad_tenant_is_rejected(tenant: str) -> None:
    with pytest.raises(ValueError, match="tenant"):
        CoordinatorSettings.from_env({"VRAMFABRIC_TENANT": tenant})


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"VRAMFABRIC_PLACEMENT": "random"}, "placement"),
        ({"VRAMFABRIC_LEASE_TTL_S": "0.5"}, "lease_ttl_s"),
        ({"VRAMFABRIC_SLICE_BYTES": "0"}, "size must be positive"),
        ({"VRAMFABRIC_MAX_SLICES": "0"}, "max_slices"),
        ({"VRAMFABRIC_ACK_WAIT_S": "0"}, "ack_wait_s"),
    ],
)
def test_coordinator_out_of_range_values_are_rejected(env: dict[str, str], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CoordinatorSettings.from_env(env)


def test_coordinator_lease_batch_fits_one_lease_request() -> None:
    # A batch of MAX_LEASE_COUNT is the most one LeaseRequest may ask for
    assert CoordinatorSettings(max_lease_batch=MAX_LEASE_COUNT).max_lease_batch == MAX_LEASE_COUNT
    with pytest.raises(ValueError, match="max_lease_batch"):
        CoordinatorSettings(max_lease_batch=MAX_LEASE_COUNT + 1)
    with pytest.raises(ValueError, match="max_lease_batch"):
        CoordinatorSettings(max_lease_batch=0)


def test_worker_execution_settings_from_the_environment() -> None:
    s = WorkerSettings.from_env(
        {
            "VRAMFABRIC_ISOLATION": "process",
            "VRAMFABRIC_ALLOW_CODE": "yes",
            "VRAMFABRIC_CHUNK_TIMEOUT_S": "90",
        }
    )
    assert (s.isolation, s.allow_code, s.chunk_timeout_s) == ("process", True, 90.0)
    assert not WorkerSettings.from_env({}).allow_code
    # Unset, how long an idle executor stays up is the pool's choice by GPU kind
    assert WorkerSettings.from_env({}).executor_idle_s is None
    assert WorkerSettings.from_env({"VRAMFABRIC_EXECUTOR_IDLE_S": "120"}).executor_idle_s == 120.0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VRAMFABRIC_ISOLATION", "vm"),
        ("VRAMFABRIC_ALLOW_CODE", "maybe"),
        ("VRAMFABRIC_EXECUTOR_IDLE_S", "-1"),
        ("VRAMFABRIC_EXECUTOR_IDLE_S", "soon"),
    ],
)
def test_worker_bad_execution_settings_are_rejected(name: str, value: str) -> None:
    with pytest.raises(ValueError):
        WorkerSettings.from_env({name: value})
