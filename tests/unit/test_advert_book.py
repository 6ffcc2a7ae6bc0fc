"""Who waits, as a node reads it from the fleet's adverts (worker/node/advert_book.py)."""

from __future__ import annotations

from vramfabric.broker.messages import GpuState, NodeAdvert
from vramfabric.worker.node.advert_book import AdvertBook

GIB = 2**30


def advert(node: str, *waiting: str, gpus: bool = True) -> NodeAdvert:
    """A node's advert naming `waiting` tenants (no GPUs: its goodbye)."""
    gpu = GpuState(0, "sim", 8 * GIB, 8 * GIB, 0, GIB)
    return NodeAdvert(node, (gpu,) if gpus else (), {}, 0.0, waiting=tuple(waiting))


def test_waiting_tenants_come_from_the_latest_fresh_advert_of_every_other_node() -> None:
    book = AdvertBook(node_ttl_s=5.0)
    book.heard(advert("n1", "alice"), now=100.0)
    book.heard(advert("n2", "alice", "bob"), now=101.0)
    book.heard(advert("me", "carol"), now=101.0)
    # Every other node's waiting tenants, not the asking node's own advert
    assert book.waiting(102.0, besides="me") == {"alice", "bob"}
    assert book.waiting(102.0, besides="n2") == {"alice", "carol"}
    # A newer advert replaces the node's older one
    book.heard(advert("n2"), now=103.0)
    assert book.waiting(103.0, besides="me") == {"alice"}
    # A goodbye removes the node, and what it said
    book.heard(advert("n1", gpus=False), now=103.5)
    assert book.waiting(103.5, besides="me") == set()
    assert [a.node for a in book.fresh(103.5, besides="me")] == ["n2"]


def test_adverts_older_than_the_node_ttl_no_longer_count() -> None:
    book = AdvertBook(node_ttl_s=5.0)
    book.heard(advert("n1", "alice"), now=100.0)
    book.heard(advert("n2", "bob"), now=103.0)
    assert book.waiting(105.0, besides="me") == {"alice", "bob"}
    # n1's advert is 5.5 s old: stale; n2's 2.5 s: fresh
    assert book.waiting(105.5, besides="me") == {"bob"}
    assert [a.node for a in book.fresh(105.5, besides="me")] == ["n2"]
    # n1 advertises again: it counts again; then both go stale
    book.heard(advert("n1", "alice"), now=106.0)
    assert book.waiting(107.0, besides="me") == {"alice", "bob"}
    assert book.waiting(111.1, besides="me") == set()
    assert book.fresh(111.1, besides="me") == []


def test_a_tenant_named_twice_in_one_advert_is_forgotten_with_it() -> None:
    book = AdvertBook(node_ttl_s=5.0)
    book.heard(advert("n1", "alice", "alice"), now=100.0)
    book.heard(advert("n2", "alice"), now=100.0)
    book.heard(advert("n1"), now=101.0)
    assert book.waiting(101.0, besides="me") == {"alice"}
    book.heard(advert("n2"), now=101.0)
    assert book.waiting(101.0, besides="me") == set()
