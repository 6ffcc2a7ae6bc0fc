"""coordinator/run/seen.py: which chunks have a result folded, checked and marked in runs."""

from __future__ import annotations

from vramfabric.coordinator.run.seen import SeenTable


def test_runs_are_fresh_until_one_of_their_chunks_is_marked() -> None:
    # Given a table of 10 chunks with chunk 4 marked
    table = SeenTable.sized(10)
    table.mark(4)
    # Then a run is fresh only if it holds no marked chunk
    assert table.fresh(0, 4) and not table.fresh(2, 3) and table.fresh(5, 5)
    # When a run is marked at once
    table.mark(6, 3)
    # Then exactly its chunks are seen
    assert [i for i in range(10) if table.seen(i)] == [4, 6, 7, 8]


def test_a_streamed_job_s_table_grows_with_its_chunks() -> None:
    # Given an empty table (a streamed job, its size unknown)
    table = SeenTable.sized(0)
    # Then chunks past its end are not seen, and a run there is fresh
    assert not table.seen(7) and table.fresh(5, 10)
    # When chunks past the end are marked, one alone and a run
    table.mark(20)
    table.mark(30, 2)
    # Then they are seen, and the chunks between them are not
    assert table.seen(20) and table.seen(31) and not table.seen(25) and not table.fresh(29, 2)
