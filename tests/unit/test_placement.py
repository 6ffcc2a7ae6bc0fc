"""coordinator/leases/placement.py: plan() splits wanted leases over nodes by free slices."""

from __future__ import annotations

import uuid

import pytest

from vramfabric.broker.messages import GpuState, LeaseRequest, NodeAdvert
from vramfabric.coordinator.leases.placement import plan
from vramfabric.coordinator.settings import CoordinatorSettings
from vramfabric.worker.leases.ledger import SliceLedger
from vramfabric.worker.node.gpus import parse_simulate

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


def test_spread_is_the_default_policy() -> None:
    assert plan(FLEET, S, 4) == plan(FLEET, S, 4, "spread")
    assert CoordinatorSettings().placement == "spread"


def test_spread_gives_each_lease_to_the_gpu_with_most_free_slices() -> None:
    # GPUs: a/0 = 2, b/0 = 3, b/1 = 2, c/0 = 3 free slices
    # Three leases: b/0 and c/0 (3 each), then the four GPUs tie at 2 and a/0 comes first
    assert sorted(plan(FLEET, S, 3, "spread")) == [("a", 1), ("b", 1), ("c", 1)]
    # Two leases: the two GPUs with most free slices
    assert sorted(plan(FLEET, S, 2, "spread")) == [("b", 1), ("c", 1)]


def test_spread_counts_gpus_not_nodes() -> None:
    # Nine of ten: every GPU down to 1 free (6 leases), then one each to a/0, b/0, b/1
    assert dict(plan(FLEET, S, 9, "spread")) == {"a": 2, "b": 5, "c": 2}
    # A node with eight GPUs takes eight times the share of a node with one
    fleet = [advert("big", *[10] * 8), advert("small", 10)]
    assert dict(plan(fleet, S, 90, "spread")) == {"big": 80, "small": 10}


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


def simulated_fleet(n_nodes: int, spec: str) -> dict[str, SliceLedger]:
    """Node ledgers as simulated workers build them (512 MiB granule, the default slice)."""
    granule = CoordinatorSettings().slice_bytes
    return {f"n{i}": SliceLedger(f"n{i}", parse_simulate(spec), granule) for i in range(n_nodes)}


def lease_fleet(ledgers: dict[str, SliceLedger], wanted: int, policy: str) -> set[tuple[str, int]]:
    """Plan from the nodes' adverts, have each node grant its share; the GPUs that got leases."""
    slice_bytes = CoordinatorSettings().slice_bytes
    adverts = [ledger.advert(0.0) for ledger in ledgers.values()]
    used: set[tuple[str, int]] = set()
    for node, count in plan(adverts, slice_bytes, wanted, policy):
        req = LeaseRequest(uuid.uuid4().hex[:12], "j1", count, slice_bytes, 30.0)
        grant = ledgers[node].grant(req, "acme", 0.0)
        assert len(grant.leases) == count
        used |= {(node, lease.gpu) for lease in grant.leases}
    return used


def test_a_1000_lease_job_on_4_nodes_of_4_gpus_lands_on_all_16_gpus() -> None:
    # Given four simulated nodes of four 48 GiB GPUs (96 slices of 512 MiB each)
    ledgers = simulated_fleet(4, "4x48GiB")
    # When a job asks for 1000 leases with the default placement
    used = lease_fleet(ledgers, 1000, CoordinatorSettings().placement)
    # Then every GPU of every node holds some: 1000 / 16 = 62.5, so 62 or 63 each
    assert used == {(node, gpu) for node in ledgers for gpu in range(4)}
    slice_bytes = CoordinatorSettings().slice_bytes
    per_gpu = [g.leased_bytes // slice_bytes for x in ledgers.values() for g in x.advert(0).gpus]
    assert sum(per_gpu) == 1000
    assert set(per_gpu) == {62, 63}


def test_pack_stays_available_and_fills_whole_nodes_first() -> None:
    # Given the same fleet, When 1000 leases are packed
    ledgers = simulated_fleet(4, "4x48GiB")
    used = lease_fleet(ledgers, 1000, "pack")
    # Then three nodes take them (384 + 384 + 232) and the fourth stays free
    assert {node for node, _ in used} == {"n0", "n1", "n2"}
