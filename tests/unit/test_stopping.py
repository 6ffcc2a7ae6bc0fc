"""broker/stopping.py: a task that swallows a cancel (as nats-py's publish may) still stops."""

from __future__ import annotations

import asyncio

from vramfabric.broker.stopping import stop_task


async def _beats_swallowing_the_first_cancel(beats: list[int]) -> None:
    """A periodic task whose 'publish' swallows one cancellation, as nats-py's flush does."""
    swallowed = False
    while True:
        try:
            await asyncio.sleep(0.01)  # the beat's period (a publish that swallows a cancel)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True
        beats.append(1)


async def test_a_task_that_swallows_a_cancel_is_cancelled_again_until_it_ends() -> None:
    # Given a running task that swallows the first cancel and would run on for good
    beats: list[int] = []
    task = asyncio.ensure_future(_beats_swallowing_the_first_cancel(beats))
    await asyncio.sleep(0)
    # When it is stopped
    outcome = await asyncio.wait_for(stop_task(task), timeout=30)
    # Then it has ended, cancelled, and nothing is reported as its error
    assert task.done() and task.cancelled() and outcome is None
    # And a plain cancel would not have stopped it (what the heartbeat's stop awaited)
    again = asyncio.ensure_future(_beats_swallowing_the_first_cancel([]))
    await asyncio.sleep(0)
    again.cancel()
    done, _ = await asyncio.wait({again}, timeout=0.2)
    assert not done
    await stop_task(again)


async def test_what_a_task_raised_is_returned() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    task = asyncio.ensure_future(fails())
    await asyncio.wait({task})
    outcome = await stop_task(task)
    assert isinstance(outcome, ValueError)
