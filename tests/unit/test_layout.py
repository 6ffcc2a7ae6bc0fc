"""Which executor process each lease's chunks run in (worker/executors/layout.py)."""

from __future__ import annotations

from collections import Counter

from vramfabric.broker.messages import Lease
from vramfabric.worker.executors.layout import LANE, ExecutorLayout


def lease(n: int, gpu: int = 0, tenant: str = "t1") -> Lease:
    """Lease `l<n>` of one slice on `gpu` for `tenant`."""
    return Lease(f"l{n}", "n1", gpu, 2**30, "job1", tenant, 0.0)


def test_function_leases_fill_the_lanes_then_share_the_least_loaded() -> None:
    # Given 3 lanes per (GPU, tenant)
    layout = ExecutorLayout("thread", lanes=3)
    # When 7 leases of a Python function come
    keys = [layout.key_of(lease(n), "python") for n in range(7)]
    # Then the first 3 get a lane each, and the rest spread evenly over them
    assert keys[:3] == [(0, "t1", f"{LANE}{n}") for n in range(3)]
    assert sorted(Counter(keys).values()) == [2, 2, 3]
    # And another tenant's or GPU's leases get lanes of their own
    assert layout.key_of(lease(8, tenant="t2"), "python") == (0, "t2", f"{LANE}0")
    assert layout.key_of(lease(9, gpu=1), "python") == (1, "t1", f"{LANE}0")


def test_a_lane_whose_leases_ended_is_the_next_one_taken() -> None:
    # Given 3 lanes, each with a lease
    layout = ExecutorLayout("thread", lanes=3)
    for n in range(3):
        layout.key_of(lease(n), "python")
    # When the second lane's lease ends
    assert layout.live_keys({"l0", "l2"}) == {(0, "t1", f"{LANE}0"), (0, "t1", f"{LANE}2")}
    # Then the next lease takes that lane, not a shared one
    assert layout.key_of(lease(3), "python") == (0, "t1", f"{LANE}1")


def test_kernels_share_one_process_per_tenant_and_gpu() -> None:
    layout = ExecutorLayout("thread", lanes=3)
    assert {layout.key_of(lease(n), "builtin") for n in range(5)} == {(0, "t1", "")}
