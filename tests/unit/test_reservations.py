"""broker/messages/ QuotaReservations: what counts against a quota, and its bucket name."""

from __future__ import annotations

from vramfabric.broker import Subjects, decode, encode
from vramfabric.broker.messages import QuotaReservations, Reservation

GIB = 2**30


def test_reservations_round_trip_through_the_codec() -> None:
    # Given two nodes' reservations of one tenant
    book = QuotaReservations({"n1": Reservation(2 * GIB, 100.0), "n2": Reservation(GIB, 50.0)})
    # When encoded and decoded, Then nothing changed
    assert decode(QuotaReservations, encode(book)) == book


def test_held_bytes_counts_only_other_nodes_holds_that_last() -> None:
    # Given n1's hold until 100, n2's until 50 and n3's until 200
    book = QuotaReservations(
        {
            "n1": Reservation(2 * GIB, 100.0),
            "n2": Reservation(GIB, 50.0),
            "n3": Reservation(GIB, 200.0),
        }
    )
    # Then at 60, n2's lapsed hold and the asking node's own are left out
    assert book.held_bytes(60.0) == 3 * GIB
    assert book.held_bytes(60.0, besides="n1") == GIB
    # And a hold lapses exactly at its `until`
    assert book.held_bytes(100.0) == GIB


def test_the_quota_bucket_is_named_from_the_prefix() -> None:
    assert Subjects("t1").quota_bucket() == "t1_quota"
    assert Subjects("vf").quota_bucket() != Subjects("vg").quota_bucket()
