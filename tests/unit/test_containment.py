"""Executor containment: the uid range setting, the tenant-to-uid mapping, the environment."""

from __future__ import annotations

import logging
import os

import pytest

from vramfabric.broker.messages import GpuState, NodeAdvert
from vramfabric.report import advert_dict
from vramfabric.worker import WorkerSettings
from vramfabric.worker.executors.containment import (
    SHARED,
    Containment,
    Sandbox,
    executor_env,
    uid_for,
)
from vramfabric.worker.node.uids import UidRange

RANGE = UidRange(20000, 20999)


def test_uid_range_parses_first_dash_last() -> None:
    assert UidRange.parse(" 20000-20999 ") == RANGE
    assert RANGE.size == 1000 and str(RANGE) == "20000-20999"


@pytest.mark.parametrize(
    "text", ["", "20000", "a-b", "20000-", "-5-10", "0-10", "20-10", "1-4294967295", "1.5-9"]
)
def test_a_bad_uid_range_is_refused_saying_what_a_good_one_looks_like(text: str) -> None:
    with pytest.raises(ValueError, match=r"20000-20999|uids 1 to"):
        UidRange.parse(text)


def test_worker_settings_read_the_uid_range_and_name_the_variable_when_it_is_bad() -> None:
    settings = WorkerSettings.from_env({"VRAMFABRIC_EXECUTOR_UIDS": "20000-20999"})
    assert settings.executor_uids == RANGE
    assert WorkerSettings.from_env({}).executor_uids is None
    with pytest.raises(ValueError, match="VRAMFABRIC_EXECUTOR_UIDS"):
        WorkerSettings.from_env({"VRAMFABRIC_EXECUTOR_UIDS": "root"})


def test_a_tenant_always_maps_to_the_same_uid_in_the_range() -> None:
    # Given nothing taken, When a tenant is mapped twice, Then it gets the same uid, in range
    first = uid_for("alpha", RANGE, lambda _uid: False)
    assert first == uid_for("alpha", RANGE, lambda _uid: False)
    assert first is not None and RANGE.first <= first <= RANGE.last


def test_tenants_whose_hashes_collide_get_different_uids() -> None:
    # Given a range of two uids, one of them held by tenant alpha
    small = UidRange(500, 501)
    alpha = uid_for("alpha", small, lambda _uid: False)
    # When beta is mapped while alpha's uid is taken, Then it gets the other one
    assert uid_for("beta", small, lambda uid: uid == alpha) == (501 if alpha == 500 else 500)


def test_uids_taken_by_accounts_are_skipped_and_a_full_range_maps_to_none() -> None:
    taken = set(range(20000, 20999))
    assert uid_for("alpha", RANGE, taken.__contains__) == 20999
    assert uid_for("alpha", RANGE, lambda _uid: True) is None


def test_many_tenants_spread_over_the_range() -> None:
    uids = {uid_for(f"tenant{i}", RANGE, lambda _uid: False) for i in range(50)}
    assert len(uids) > 45  # a hash, not a counter: a few collisions, resolved when assigned


def test_the_executor_environment_carries_no_credentials() -> None:
    # Given a worker's environment with its NATS password and a cloud key
    environ = {
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": "0",
        "LC_ALL": "C",
        "HOME": "/root",
        "VRAMFABRIC_NATS_PASSWORD": "secret",
        "VRAMFABRIC_NATS_CREDS": "/etc/vf.creds",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "NATS_TOKEN": "secret",
    }
    # When an executor's environment is built, shared and contained
    shared = executor_env(environ, None)
    contained = executor_env(environ, Sandbox(20001, 20001, "/tmp/x/u20001"))
    # Then no secret is in either, and the contained one lives in its own directory
    for env in (shared, contained):
        assert "secret" not in env.values() and "/etc/vf.creds" not in env.values()
        assert env["PATH"] == "/usr/bin" and env["CUDA_VISIBLE_DEVICES"] == "0"
        assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert shared["HOME"] == "/root"
    assert contained["HOME"] == "/tmp/x/u20001" and contained["TMPDIR"] == "/tmp/x/u20001/tmp"


def test_executors_get_one_blas_thread_unless_the_operator_says_otherwise() -> None:
    # Given a worker's environment that sets one thread count and not the others
    environ = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "4"}
    # When an executor's environment is built
    env = executor_env(environ, None)
    # Then the operator's count stands and the other pools start one thread each
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["MKL_NUM_THREADS"] == "1"


def test_a_worker_that_is_not_root_says_its_executors_share_its_uid(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a worker running as an ordinary user, with no uid range
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    # When it starts with tenants' code allowed, and shared uids allowed
    with caplog.at_level(logging.INFO, "vramfabric.worker.executors.containment"):
        containment = Containment.start(None, allow_code=True, allow_shared_uid=True)
    # Then it runs them shared, and says so in one warning
    assert containment.mode == SHARED and containment.sandbox("alpha") is None
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "shared-uid" in record.getMessage()


def test_a_configured_range_holding_the_workers_own_uid_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 20500)
    with pytest.raises(ValueError, match="VRAMFABRIC_EXECUTOR_UIDS=20000-20999"):
        Containment.start(RANGE, allow_code=True)


def test_status_shows_each_nodes_containment() -> None:
    gpu = GpuState(0, "sim", 2**30, 2**30, 0, 2**30, True)
    advert = NodeAdvert("n1", (gpu,), {}, 0.0, containment="uid-per-tenant")
    assert advert_dict(advert)["containment"] == "uid-per-tenant"
