"""StoredReplay: a resumed run waits for the results stored before it to come through.

One pass over the results stream both resumes a job (its stored results folded) and, for
`retry_failed`, finds its failures: until the wait ends they are set aside, not folded, and
the run sends their chunks again (results.py, `ResultsConsumer.replayed`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

import attrs


@attrs.define
class StoredReplay:
    """Counts stored chunks as their results come through; sets failures aside if asked."""

    # `retry_failed`: stored failed results are set aside until `wait` returns.
    set_aside_failed: bool = False
    set_aside: set[int] = attrs.field(factory=set)
    # While `wait` waits: the stored chunks, how many of them came through, and a wake-up.
    _stored: Collection[int] = ()
    _reached: int = 0
    _arrived: asyncio.Event = attrs.field(factory=asyncio.Event)

    @property
    def waiting(self) -> bool:
        """Whether a wait is on: each result is then checked against the stored chunks."""
        return bool(self._stored)

    def reach(self, index: int, ok: bool) -> bool:
        """Count a stored chunk come through; True if its failure is set aside."""
        aside = self.set_aside_failed and not ok
        if index in self._stored and index not in self.set_aside:
            self._reached += 1
            self._arrived.set()
        if aside:
            self.set_aside.add(index)
        return aside

    def wake(self) -> None:
        """Wake the wait: the run failed, no more results will come."""
        self._arrived.set()

    async def wait(
        self, stored: Collection[int], seen: Callable[[int], bool], failed: Callable[[], bool]
    ) -> set[int]:
        """Wait until every chunk of `stored` came through, or `failed()`; those set aside.

        From then on failures are folded like any result (those of the rerun are final).
        """
        self._stored = stored
        self._reached = sum(1 for i in stored if seen(i) or i in self.set_aside)
        while self._reached < len(stored) and not failed():
            self._arrived.clear()
            await self._arrived.wait()
        self.set_aside_failed, self._stored = False, ()
        return self.set_aside
