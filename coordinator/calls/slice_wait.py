"""Waiting for a block's slice: refused at once where it cannot come, the wait shown as a line.

A block's slice is leased like a job's, but a person waits for it: no live worker that runs
the call, or no GPU as large as the slice, is said at once; a full fleet shows a line on
stderr, rewritten as the queue moves (how many tenants stand ahead), until a slice is free,
the wait's limit passes, or Ctrl-C.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from vramfabric.broker.errors import CapacityExceeded, CodeRefused, SliceTooLarge
from vramfabric.broker.messages import NodeAdvert

from ..jobs.work import JobWork
from ..leases.fleet import FleetView
from ..leases.leasing import LeasePool

# How often a wait for a slice asks the fleet again, at the most.
_ASK_EVERY_S = 1.0


@attrs.frozen
class SliceWait:
    """How a block waits for its slice: for how long, where it says so, and why it waits."""

    # None: until a slice is free, or Ctrl-C.
    wait_s: float | None
    # Shows a line (a carriage return first: it is rewritten in place).
    say: Callable[[str], None]
    # The node took the block's slice back: this is its next one.
    again: bool = False


async def wait_for_slice(pool: LeasePool, fleet: FleetView, work: JobWork, wait: SliceWait) -> None:
    """Lease one slice in `pool`, waiting as `wait` says, showing the wait.

    Raises:
        CodeRefused: no live worker runs this Python's functions.
        SliceTooLarge: no GPU of those workers is as large as the slice.
        CapacityExceeded: no slice was free within `wait.wait_s`.
    """
    runs = [a for a in fleet.adverts.values() if work.runs_on(a)]
    if not runs:
        raise CodeRefused(
            f"no live worker runs Python functions on Python {work.python} "
            f"(of {len(fleet.adverts)} live: start workers with --allow-code)"
        )
    _check_fits(pool.settings.slice_bytes, runs)
    t0 = time.monotonic()
    shown = ""
    try:
        while not await pool.acquire(1):
            left = None if wait.wait_s is None else t0 + wait.wait_s - time.monotonic()
            if left is not None and left <= 0:
                raise CapacityExceeded(wanted=1, got=0)
            line = _waiting_line(pool, wait)
            if line != shown:
                wait.say(f"\r{line}")
                shown = line
            step = _ASK_EVERY_S if left is None else min(left, _ASK_EVERY_S)
            await fleet.wait_changed(timeout_s=step)
    finally:
        if shown:
            waited_s = time.monotonic() - t0
            got = "got a slice" if pool.leases else "no slice"
            wait.say(f"\r{shown} ... {got} after {waited_s:.1f} s\n")


def _waiting_line(pool: LeasePool, wait: SliceWait) -> str:
    """What a person sees while the block waits for a slice."""
    what = "the slice was taken back; waiting for another" if wait.again else "waiting for a slice"
    ahead = pool.ahead
    queue = "the fleet is full" if ahead is None else f"{ahead} tenant(s) ahead"
    until = "Ctrl-C to stop" if wait.wait_s is None else f"up to {wait.wait_s:g} s"
    return f"vramfabric: {what} of {_gib(pool.settings.slice_bytes)} ({queue}; {until})"


def _check_fits(need: int, runs: list[NodeAdvert]) -> None:
    """Fail at once where no GPU of the workers that run the call holds the slice."""
    gpus = [(g.total_bytes, a.node) for a in runs for g in a.gpus]
    if not gpus:
        return
    largest, node = max(gpus)
    if need > largest:
        raise SliceTooLarge(
            f"no GPU in the fleet holds a slice of {_gib(need)}: the largest slice it "
            f"has is {_gib(largest)} (a whole GPU of node {node})"
        )


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"
