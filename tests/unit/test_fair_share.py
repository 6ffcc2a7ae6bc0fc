"""Turns and take-backs of the fair share (worker/leases/fairness.py, turns.py, served.py), pure."""

from __future__ import annotations

from vramfabric.broker.messages import LeaseRequest, NodeAdvert
from vramfabric.broker.tenants import TenantPolicy
from vramfabric.worker.leases.fairness import TURN, FleetShare, ShareTiming
from vramfabric.worker.leases.ledger import SliceLedger
from vramfabric.worker.leases.served import ServiceMeter
from vramfabric.worker.leases.turns import node_part
from vramfabric.worker.node.advert_book import AdvertBook
from vramfabric.worker.node.gpus import GpuSpec

GIB = 2**30
TIMING = ShareTiming(waiting_ttl_s=10.0, turn_s=5.0, grace_s=1.0, settle_s=0.5)


def node(name: str, slices: int = 4) -> FleetShare:
    """A node of `slices` one-GiB slices, with an advert book of its own."""
    ledger = SliceLedger(name, (GpuSpec(0, "sim", slices * GIB),), GIB)
    return FleetShare(ledger, TenantPolicy(), AdvertBook(node_ttl_s=5.0), TIMING)


def grant(share: FleetShare, tenant: str, count: int, now: float, rid: str) -> int:
    """Grant what the fair share allows of `count` slices; how many were granted."""
    cap, _why = share.grant_cap(tenant, GIB, count, now)
    if cap == 0:
        return 0
    req = LeaseRequest(request_id=rid, job="j", count=cap, slice_bytes=GIB, ttl_s=3600)
    granted = share.ledger.grant(req, tenant, now).leases
    share.meter.charge(tenant, GIB, len(granted))
    return len(granted)


def advert_of(share: FleetShare, now: float) -> NodeAdvert:
    """The node's advert with what the fair share adds (who waits, recent service)."""
    facts = share.advert_facts(now)
    waiting, served = facts["waiting"], facts["served"]
    assert isinstance(waiting, tuple) and isinstance(served, dict)
    return NodeAdvert(
        share.ledger.node,
        share.ledger.advert(now).gpus,
        share.ledger.advert(now).tenants,
        now,
        waiting=waiting,
        served=served,
    )


def test_node_part_splits_a_count_over_nodes_exactly_and_alike_everywhere() -> None:
    holdings = {"a": 3, "b": 3, "c": 2}
    # Every node computes its part; together they give back exactly the count
    for count in range(9):
        parts = [node_part(count, holdings, n) for n in holdings]
        assert sum(parts) == count
        assert all(p <= holdings[n] for p, n in zip(parts, holdings, strict=True))
    # A node holding none of it gives nothing back
    assert node_part(3, holdings, "d") == 0


def test_a_share_below_one_slice_still_grants_one_slice_to_a_tenant_holding_none() -> None:
    # Given 8 slices held by 8 tenants, one each, and a ninth tenant waiting
    share = node("n1", slices=9)
    for i in range(8):
        assert grant(share, f"s{i}", 1, 0.0, f"r{i}") == 1
    share.note_waiting("s8", 0.0)
    share.note_waiting("s0", 0.0)
    # When the ninth asks (its share is 9/10 of a slice)
    # Then it gets one slice, not a share rounded down to nothing
    assert grant(share, "s8", 1, 0.1, "r8") == 1


def test_a_freed_slice_goes_to_the_waiting_tenant_served_least_lately() -> None:
    # Given 12 tenants on 8 slices: 8 hold one each, 4 wait, one of them served long ago
    share = node("n1", slices=8)
    for i in range(8):
        assert grant(share, f"s{i}", 1, 0.0, f"r{i}") == 1
    share.meter.charge("s9", GIB, 3)  # served three times already
    share.advert_facts(0.0)
    for w in ("s8", "s9", "s10", "s11"):
        share.note_waiting(w, 0.0)
    # When s0 gives its slice back and asks again at once
    share.ledger.release(["r0-0"], "s0")
    share.note_waiting("s0", 0.1)
    cap, why = share.grant_cap("s0", GIB, 1, 0.1)
    # Then it is not its turn: three tenants served less than it stand before it
    assert cap == 0 and why.startswith(TURN)
    # And s9, served more than the other waiters, must wait for them too
    assert share.grant_cap("s9", GIB, 1, 0.1)[0] == 0
    # But the waiting tenant first in line gets it
    assert grant(share, "s10", 1, 0.2, "r10") == 1


def test_a_turn_kept_for_a_tenant_that_never_comes_passes_after_the_grace_period() -> None:
    # Given a full node of 2 slices, a waiter first in line, and a slice freed
    share = node("n1", slices=2)
    assert grant(share, "a", 1, 0.0, "ra") == 1
    assert grant(share, "b", 1, 0.0, "rb") == 1
    share.meter.charge("a", GIB, 5)
    share.note_waiting("gone", 0.0)
    share.note_waiting("a", 0.0)
    share.ledger.release(["ra-0"], "a")
    # When the tenant first in line does not ask for it
    assert share.grant_cap("a", GIB, 1, 0.1)[0] == 0
    # Then after the grace period the next asker gets it
    assert share.grant_cap("a", GIB, 1, 0.1 + TIMING.grace_s + 0.1)[0] == 1


def test_nodes_take_back_a_hoarders_excess_between_them_whatever_its_ttl() -> None:
    # Given two nodes of 4 slices, a tenant holding all 8, and another now waiting on n2
    n1, n2 = node("n1"), node("n2")
    assert grant(n1, "hog", 4, 0.0, "h1") == 4
    assert grant(n2, "hog", 4, 0.0, "h2") == 4
    n2.note_waiting("late", 0.0)
    for here, there in ((n1, n2), (n2, n1)):
        here.book.heard(advert_of(there, 0.0), 0.0)
    # When each node looks at the hoarder's leases (no renewal needed)
    taken = []
    for share in (n1, n2):
        leases = [lease for lease in share.ledger.holding() if lease.tenant == "hog"]
        ids, why = share.to_revoke("hog", leases, 0.1)
        taken.append(len(ids))
        assert "fair share" in why and "hog" in why
    # Then together they take back its excess over its share: 4 of 8, 2 each
    assert taken == [2, 2]


def test_leases_taken_back_while_their_work_runs_are_not_taken_back_twice() -> None:
    # Given a node of 4 slices whose leases all run chunks, held by one tenant, and another
    # tenant waiting (shares of 2 slices)
    share = node("n1")
    assert grant(share, "hog", 4, 0.0, "h") == 4
    for lease in share.ledger.holding():
        share.ledger.occupy(lease.lease_id)
    share.note_waiting("late", 0.0)
    # When the node takes back the excess (2), and later looks again while those 2 still run
    ids, _why = share.to_revoke("hog", share.ledger.holding(), 0.0)
    share.ledger.release(ids, "hog")
    live = [x for x in share.ledger.holding() if share.ledger.get(x.lease_id)]
    later = share.to_revoke("hog", live, 5.0)
    # Then the first time takes 2, and the second nothing (the 2 still count as held)
    assert len(ids) == 2 and later == ([], "")


def test_a_tenant_over_its_share_by_less_than_a_slice_gives_it_back_after_its_turn() -> None:
    # Given 2 slices, held by two tenants, and a third waiting (shares of 2/3 slice)
    share = node("n1", slices=2)
    assert grant(share, "a", 1, 0.0, "ra") == 1
    assert grant(share, "b", 1, 0.0, "rb") == 1
    share.note_waiting("c", 0.0)
    a_lease = [lease for lease in share.ledger.holding() if lease.tenant == "a"]
    share.advert_facts(1.0)
    # When its turn is not over yet: nothing is taken back
    assert share.to_revoke("a", a_lease, 1.0) == ([], "")
    # Then once it has held the slice for a turn, it gives it back
    share.advert_facts(TIMING.turn_s + 1)
    ids, _why = share.to_revoke("a", a_lease, TIMING.turn_s + 1)
    assert ids == [a_lease[0].lease_id]


def test_service_decays_by_its_half_life_and_grows_with_what_is_held() -> None:
    meter = ServiceMeter(halflife_s=10.0)
    meter.charge("a", GIB, 2)
    meter.tick({}, 0.0)
    meter.tick({"b": GIB}, 10.0)
    # a's grant halved in one half-life; b held a GiB for 10 s
    assert meter.get("a") == GIB
    assert meter.get("b") == 10 * GIB
