"""How the packer cuts a batch of chunks into messages, from what results said."""

from __future__ import annotations

from vramfabric.broker.subjects import MAX_PACK_CHUNKS
from vramfabric.coordinator.run.packing import (
    PACK_INPUT_BYTES,
    PACK_OUTPUT_BYTES,
    PROBE_CHUNKS,
    PROBE_WAIT_S,
    ChunkSpeed,
    Packer,
)
from vramfabric.coordinator.run.window import Window


def inputs(n: int, size: int = 12) -> dict[int, bytes]:
    """`n` chunk inputs of `size` bytes."""
    return {i: b"x" * size for i in range(n)}


def test_auto_sends_chunks_alone_until_a_result_shows_them_tiny() -> None:
    # Given auto packing and no result yet
    speed = ChunkSpeed()
    packer = Packer(0, speed)
    # Then the first few chunks go one per message, whatever the leases, while the rest wait
    assert packer.spans([0, 1, 2], inputs(3)) == [(0, 0), (1, 1), (2, 2)]
    assert packer.probing
    assert packer.throttle(leases=500, now=100.0) == PROBE_CHUNKS
    # And while no result comes, four times as many every PROBE_WAIT_S, up to one per lease
    assert packer.throttle(leases=500, now=100.0 + PROBE_WAIT_S * 1.5) == 4 * PROBE_CHUNKS
    assert packer.throttle(leases=500, now=100.0 + PROBE_WAIT_S * 2.5) == 16 * PROBE_CHUNKS
    assert packer.throttle(leases=500, now=100.0 + PROBE_WAIT_S * 20) == 500
    assert packer.throttle(leases=1, now=100.0 + PROBE_WAIT_S * 20) == PROBE_CHUNKS
    # When a result says a chunk ran 0.2 ms (its executor's wall time)
    speed.observe(0.0002)
    # Then contiguous chunks go in packs of about 50 ms of work, with nothing held back
    assert packer.throttle(leases=500, now=101.0) is None
    assert packer.spans(list(range(600)), inputs(600)) == [(0, 249), (250, 499), (500, 599)]


def test_long_chunks_keep_a_message_each_and_get_the_whole_window() -> None:
    # Given auto packing and results of 50 ms chunks
    speed = ChunkSpeed()
    packer = Packer(0, speed)
    for _ in range(2 * PROBE_CHUNKS - 1):
        speed.observe(0.05)
    assert packer.throttle(leases=4, now=0.0) == PROBE_CHUNKS  # still deciding
    speed.observe(0.05)
    # Then after two rounds of results the window opens, and nothing is packed
    assert packer.throttle(leases=4, now=0.0) is None
    assert packer.spans([0, 1], inputs(2)) == [(0, 0), (1, 1)]


def test_a_pack_of_many_results_counts_per_chunk_and_the_shortest_wins() -> None:
    speed = ChunkSpeed()
    speed.observe(0.5, n_chunks=1000)  # a pack: 0.5 ms a chunk
    speed.observe(0.2)  # a slower chunk: the shortest seen is the speed
    speed.observe(0.0)  # a coordinator's own result (exhausted): not a run
    assert speed.chunk_s == 0.0005 and speed.n_results == 2


def test_packs_stop_at_gaps_bytes_and_nodes_that_cannot_run_them() -> None:
    # Given fixed packs of up to 4
    packer = Packer(4, ChunkSpeed())
    # Then a gap (a chunk with a result already) ends a pack, and so does the byte limit
    assert packer.spans([0, 1, 3, 4, 5, 6, 7], inputs(8)) == [(0, 1), (3, 6), (7, 7)]
    big = {i: b"x" * (PACK_INPUT_BYTES // 2) for i in range(4)}
    assert packer.spans([0, 1, 2, 3], big) == [(0, 1), (2, 3)]
    # (also when the batch says its bytes: only a batch within one pack's skips the count)
    assert packer.spans([0, 1, 2, 3], big, n_bytes=2 * PACK_INPUT_BYTES) == [(0, 1), (2, 3)]
    assert packer.spans(list(range(8)), inputs(8), n_bytes=96) == [(0, 3), (4, 7)]
    # And a contiguous batch with one full-sized input is cut around it, the rest by 4
    one_big = {i: b"x" * (PACK_INPUT_BYTES if i == 5 else 1) for i in range(10)}
    assert packer.spans(list(range(10)), one_big) == [(0, 3), (4, 4), (5, 5), (6, 9)]
    # And a fleet where some node cannot run packs gets single chunks
    cannot = Packer(4, ChunkSpeed(), pack_limit=lambda: 1)
    assert cannot.spans([0, 1, 2], inputs(3)) == [(0, 0), (1, 1), (2, 2)]
    # And 1 never packs
    assert Packer(1, ChunkSpeed()).spans([0, 1], inputs(2)) == [(0, 0), (1, 1)]


def test_a_slow_chunk_seen_keeps_packs_to_a_second_of_it() -> None:
    # Given tiny chunks (0.2 ms) and one that took 100 ms (early stopping spared the others)
    speed = ChunkSpeed()
    packer = Packer(0, speed)
    speed.observe(0.0002)
    assert packer.pack_size() == 250
    speed.observe(0.1)
    # Then a pack holds at most a second of that chunk: 10 chunks
    assert packer.pack_size() == 10
    # And after a 2 s chunk, none are packed
    speed.observe(2.0)
    assert packer.pack_size() == 1


def test_messages_and_the_throttle_follow_what_results_said() -> None:
    # Given auto packing: while no result has come, a job's chunks each count as a message
    # (it may hold a lease per chunk) and each new chunk asks the throttle
    speed = ChunkSpeed()
    packer = Packer(0, speed)
    assert packer.messages(1000) == 1000 and not packer.unthrottled
    # When results show chunks of 0.2 ms: packs of 250, so 4 messages hold 1,000 chunks,
    # and the throttle is off for good
    speed.observe(0.0002)
    assert packer.messages(1000) == 4 and packer.messages(1001) == 5
    assert packer.unthrottled
    # And chunks of 50 ms each keep a message each, and the throttle still counts them
    slow = Packer(0, ChunkSpeed())
    slow.speed.observe(0.05)
    assert slow.messages(1000) == 1000 and not slow.unthrottled
    # And a job that sets its pack size packs that many from the start, unthrottled
    fixed = Packer(10, ChunkSpeed())
    assert fixed.messages(1000) == 100 and fixed.unthrottled
    assert Packer(1, ChunkSpeed()).messages(7) == 7


def test_tiny_chunks_of_a_big_job_go_in_bigger_packs_that_every_node_takes() -> None:
    # Given chunks of 2 us (a pack of 50 ms of work would hold 25,000)
    speed = ChunkSpeed()
    speed.observe(0.000002)
    # Then a job's packs hold a sixteenth of it, at least 1,000 and at most MAX_PACK_CHUNKS
    assert Packer(0, speed, n_chunks=10_000).pack_size() == 1000
    assert Packer(0, speed, n_chunks=20_000).pack_size() == 1250
    assert Packer(0, speed, n_chunks=100_000).pack_size() == MAX_PACK_CHUNKS
    # And no more than the nodes holding its leases take (an older node: 1,000)
    older = Packer(0, speed, pack_limit=lambda: 1000, n_chunks=100_000)
    assert older.pack_size() == 1000
    assert Packer(5000, speed, pack_limit=lambda: 1000).pack_size() == 1000
    # And past 1,000 their outputs (as results showed them) stay within PACK_OUTPUT_BYTES
    speed.observe(0.000002 * 10, n_chunks=10, output_bytes=10 * 200)
    assert Packer(0, speed, n_chunks=100_000).pack_size() == PACK_OUTPUT_BYTES // 200
    speed.observe(0.000002 * 10, n_chunks=10, output_bytes=10 * 2000)
    assert Packer(0, speed, n_chunks=100_000).pack_size() == 1000
    # And the window holds as many of them in flight as of packs of 1,000
    window = Window(max_chunks=10_000, max_bytes=10**9, pack_size=2000)
    assert window.chunk_limit() == 20_000
    assert Window(max_chunks=10_000, max_bytes=10**9, pack_size=1).chunk_limit() == 10_000
