"""`vramfabric status` names each unhealthy GPU and why (fabric/report.py)."""

from __future__ import annotations

import json

import pytest

from vramfabric.broker.messages import GpuState, NodeAdvert
from vramfabric.report import print_status, status_dict

GiB = 2**30


def gpu(index: int, problem: str = "", healthy: bool = True) -> GpuState:
    """An 8 GiB GPU, all free, in 1 GiB slices."""
    return GpuState(index, "m", 8 * GiB, 8 * GiB, 0, GiB, healthy=healthy, problem=problem)


def fleet() -> list[NodeAdvert]:
    """Node a: GPU 1 has ECC errors; node b: an older worker's unhealthy GPU, no reason."""
    a = NodeAdvert("a", (gpu(0), gpu(1, "2 uncorrected ECC errors", False)), {}, 0.0)
    b = NodeAdvert("b", (gpu(0, healthy=False),), {}, 0.0)
    return [a, b]


def test_status_maps_each_unhealthy_gpu_to_its_problem() -> None:
    status = status_dict(fleet())
    assert status["unhealthy_gpus"] == {"a/1": "2 uncorrected ECC errors", "b/0": "unhealthy"}
    assert status["nodes"][0]["gpus"][1]["problem"] == "2 uncorrected ECC errors"
    # Only the healthy GPU's slices count as free
    assert status["slices_free"] == 8
    json.dumps(status)


def test_status_text_says_which_gpus_take_no_leases_and_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_status(status_dict(fleet()))
    out = capsys.readouterr().out
    assert "  a: 2 GPU(s), 16.0 GiB free, 0.0 GiB leased, 1 unhealthy" in out
    assert "  unhealthy GPU a/1: 2 uncorrected ECC errors (takes no leases)" in out
    assert "  unhealthy GPU b/0: unhealthy (takes no leases)" in out


def test_a_healthy_fleet_prints_no_health_lines(capsys: pytest.CaptureFixture[str]) -> None:
    print_status(status_dict([NodeAdvert("a", (gpu(0),), {}, 0.0)]))
    assert "unhealthy" not in capsys.readouterr().out
