"""The submission window: bounded in chunks and bytes, refilled a batch at a time."""

from __future__ import annotations

import asyncio

from vramfabric.coordinator.run.window import Window


def test_window_is_full_at_its_chunk_or_byte_bound_but_takes_one_chunk_when_empty() -> None:
    # Given a window of 4 chunks or 100 bytes
    window = Window(max_chunks=4, max_bytes=100)
    # Then an empty one takes even an oversized chunk, so no input can block for ever
    assert window.fits(500)
    for i in range(3):
        window.add(i, 10)
    # And it refuses a chunk past either bound
    assert window.fits(10) and not window.fits(71)
    window.add(3, 10)
    assert not window.fits(1)


async def test_submitter_wakes_only_once_a_batch_worth_is_free() -> None:
    # Given a full window of 8 chunks (a quarter of it is the refill)
    window = Window(max_chunks=8, max_bytes=10**6)
    for i in range(8):
        window.add(i, 1)
    waiter = asyncio.get_running_loop().create_task(window.wait_room(1))
    await asyncio.sleep(0)  # the submitter is waiting
    # When one chunk finishes, and one that was never in flight "finishes"
    window.finished(0)
    window.finished(99)
    await asyncio.sleep(0)  # one turn of the loop: the waiter may run, if it can
    # Then the submitter still waits: one free place is not a batch
    assert not waiter.done() and len(window) == 7
    # When a second finishes (6 in flight: a quarter free)
    window.finished(1)
    await asyncio.wait_for(waiter, 1)
    assert len(window) == 6


def test_a_run_of_chunks_counts_and_frees_as_chunk_by_chunk_does() -> None:
    # Given a window of 8 chunks or 100 bytes
    window = Window(max_chunks=8, max_bytes=100)
    # Then a run fits only within both bounds, even when the window is empty
    assert window.fits_run(8, 100) and not window.fits_run(9, 10) and not window.fits_run(2, 101)
    # When a run of 5 chunks of 10 bytes goes out
    window.add_run(10, [10] * 5)
    # Then it counts as 5 chunks and 50 bytes in flight
    assert len(window) == 5 and window.fits_run(3, 50) and not window.fits_run(3, 51)
    # When results come for chunks 12..16 (15 and 16 were never in flight)
    window.finished_run(12, 5)
    # Then only 10 and 11 are left in flight, with their bytes
    assert len(window) == 2 and window.fits_run(6, 80) and not window.fits_run(6, 81)
