"""coordinator/placement.py: plan() splits wanted leases over nodes by free slices."""

from __future__ import annotations

import pytest

from vramfabric.broker.messages import GpuState, NodeAdvert
from vramfabric.coordinator.placement import plan

S = 2**30  # slice size and granule


def advert(node: str, *free: int, healthy: bool = True) -> NodeAdvert:
    """A node with one GPU per entry of `free`, each with that many free slices of S."""
    gpus = tuple(
        GpuState(
            index=i,
            model="sim",
            total_bytes=16 * S,
            free_bytes=n * S,
            leased_bytes=(16 - n) * S,
            slice_bytes=S,
            healthy=healthy,
        )
        for i, n in enumerate(free)
    )
    return NodeAdvert(node=node, gpus=gpus, tenants={}, sent_at=0.0)


FLEET = [advert("a", 2), advert("b", 3, 2), advert("c", 3)]  # free: a=2, b=5, c=3


def test_pack_fills_least_free_nodes_first() -> None:
    # Given nodes with 2, 5 and 3 free slices, When four are wanted
    out = plan(FLEET, S, 4, "pack")
    # Then the fullest node is topped up first, then the next fullest
    assert out == [("a", 2), ("c", 2)]


def test_pack_takes_everything_when_wanted_exceeds_capacity() -> None:
    assert plan(FLEET, S, 100, "pack") == [("a", 2), ("c", 3), ("b", 5)]


def test_pack_breaks_ties_by_node_name() -> None:
    fleet = [advert("z", 2), advert("m", 2), advert("b", 2)]
    assert plan(fleet, S, 3, "pack") == [("b", 2), ("m", 1)]


def test_pack_is_the_default_policy() -> None:
    assert plan(FLEET, S, 4) == plan(FLEET, S, 4, "pack")


def test_spread_deals_round_robin_from_the_most_free_node() -> None:
    # Three leases: one per node
    assert sorted(plan(FLEET, S, 3, "spread")) == [("a", 1), ("b", 1), ("c", 1)]
    # Two leases: the two nodes with most free slices
    assert sorted(plan(FLEET, S, 2, "spread")) == [("b", 1), ("c", 1)]


def test_spread_skips_nodes_once_they_are_full() -> None:
    # b, c, a, b, c, a (a full), b, c (c full), b
    assert dict(plan(FLEET, S, 9, "spread")) == {"a": 2, "b": 4, "c": 3}


def test_spread_takes_everything_when_wanted_exceeds_capacity() -> None:
    assert dict(plan(FLEET, S, 100, "spread")) == {"a": 2, "b": 5, "c": 3}


@pytest.mark.parametrize("policy", ["pack", "spread"])
@pytest.mark.parametrize("wanted", [0, 1, 4, 7, 10, 11])
def test_plans_never_exceed_wanted_or_free_and_have_positive_counts(
    policy: str, wanted: int
) -> None:
    free = {"a": 2, "b": 5, "c": 3}
    out = plan(FLEET, S, wanted, policy)
    assert sum(n for _, n in out) == min(wanted, 10)
    assert all(0 < n <= free[node] for node, n in out)
    assert len({node for node, _ in out}) == len(out)


@pytest.mark.parametrize("policy", ["pack", "spread"])
def test_excluded_nodes_get_nothing(policy: str) -> None:
    out = plan(FLEET, S, 100, policy, exclude=frozenset({"b"}))
    assert dict(out) == {"a": 2, "c": 3}


@pytest.mark.parametrize("policy", ["pack", "spread"])
def test_nodes_without_capacity_are_skipped(policy: str) -> None:
    fleet = [advert("full", 0, 0), advert("sick", 8, healthy=False), advert("ok", 1)]
    assert plan(fleet, S, 5, policy) == [("ok", 1)]


def test_larger_slices_count_fewer_free_slots() -> None:
    # 5 free granules on b, 2 on a, 3 on c: slices of 1.5 granules take 2 each
    assert dict(plan(FLEET, S + S // 2, 100, "pack")) == {"a": 1, "b": 2, "c": 1}


@pytest.mark.parametrize("policy", ["pack", "spread"])
def test_empty_fleet_plans_nothing(policy: str) -> None:
    assert plan([], S, 5, policy) == []


def test_unknown_policy_raises() -> None:
    with pytest.raises(ValueError, match="unknown placement policy 'random'"):
        plan(FLEET, S, 3, "random")
    with pytest.raises(ValueError, match="unknown placement policy"):
        plan([], S, 3, "random")
