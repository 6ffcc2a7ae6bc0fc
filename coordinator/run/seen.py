"""SeenTable: which chunks of a job have a result folded, a byte per chunk.

The table is a job's only per-chunk memory on the results side: sized to the job, grown as
a streamed job's chunks come (bytearray growth is amortised). Runs of chunks (a pack's) are
checked and marked at once.
"""

from __future__ import annotations

import attrs


@attrs.define
class SeenTable:
    """A byte per chunk, 1 once its first result is folded."""

    _bytes: bytearray

    @classmethod
    def sized(cls, n_chunks: int) -> SeenTable:
        """A table of `n_chunks` chunks, none seen."""
        return cls(bytearray(n_chunks))

    def seen(self, index: int) -> bool:
        """Whether chunk `index` has a result folded."""
        return index < len(self._bytes) and bool(self._bytes[index])

    def fresh(self, first: int, n: int) -> bool:
        """Whether none of chunks `first` .. `first + n - 1` has a result folded."""
        self._reach(first + n)
        return self._bytes.find(1, first, first + n) < 0

    def mark(self, first: int, n: int = 1) -> None:
        """Chunks `first` .. `first + n - 1` have their result folded."""
        self._reach(first + n)
        self._bytes[first : first + n] = b"\x01" * n

    def _reach(self, end: int) -> None:
        """Grow the table to `end` chunks (a streamed job's)."""
        if end > len(self._bytes):
            self._bytes.extend(bytes(end - len(self._bytes)))
