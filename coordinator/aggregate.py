"""Aggregators: fold chunk outputs as they stream in, in bounded memory.

Each receives `add(index, output)` once per chunk that succeeded, in arrival order, and
`value()` gives the aggregate. Ties go to the lower chunk index, so the answer does not
depend on which worker finished first.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Aggregator(Protocol):
    """Folds chunk outputs into one value."""

    def add(self, index: int, output: bytes) -> None:
        """Fold one chunk's output in."""
        ...

    def value(self) -> Any:
        """The aggregate so far."""
        ...


def scalar(output: bytes, dtype: str = "float32") -> float:
    """The first element of an output buffer as a Python float."""
    arr = np.frombuffer(output, dtype=dtype, count=1)
    return float(arr[0])


class ArgMin:
    """The chunk with the smallest scalar output: `(index, value)` or None."""

    def __init__(self, dtype: str = "float32") -> None:
        """Compare outputs decoded as `dtype`."""
        self.dtype = dtype
        self.best: tuple[float, int] | None = None

    def add(self, index: int, output: bytes) -> None:
        """Keep the output if it is the smallest seen (NaN never wins)."""
        x = scalar(output, self.dtype)
        if not math.isnan(x) and (self.best is None or (x, index) < self.best):
            self.best = (x, index)

    def value(self) -> tuple[int, float] | None:
        """(index, value) of the best chunk."""
        return None if self.best is None else (self.best[1], self.best[0])


class ArgMax(ArgMin):
    """The chunk with the largest scalar output: `(index, value)` or None."""

    def add(self, index: int, output: bytes) -> None:
        """Keep the output if it is the largest seen (NaN never wins)."""
        x = -scalar(output, self.dtype)
        if not math.isnan(x) and (self.best is None or (x, index) < self.best):
            self.best = (x, index)

    def value(self) -> tuple[int, float] | None:
        """(index, value) of the best chunk."""
        return None if self.best is None else (self.best[1], -self.best[0])


class Mean:
    """Mean and count of scalar outputs (float64 accumulation)."""

    def __init__(self, dtype: str = "float32") -> None:
        """Average outputs decoded as `dtype`."""
        self.dtype = dtype
        self.total = 0.0
        self.count = 0

    def add(self, index: int, output: bytes) -> None:
        """Add one output to the running sum."""
        self.total += scalar(output, self.dtype)
        self.count += 1

    def value(self) -> float | None:
        """The mean, or None before any output."""
        return self.total / self.count if self.count else None


class TopK:
    """The k smallest (or largest) scalar outputs as sorted `(index, value)` pairs."""

    def __init__(self, k: int, largest: bool = False, dtype: str = "float32") -> None:
        """Keep `k` outputs; `largest` picks the top instead of the bottom."""
        if k <= 0:
            raise ValueError(f"k must be > 0, got {k}")
        self.k, self.largest, self.dtype = k, largest, dtype
        self._heap: list[tuple[float, int]] = []  # worst kept on top

    def add(self, index: int, output: bytes) -> None:
        """Keep the output if it ranks among the best k."""
        x = scalar(output, self.dtype)
        if math.isnan(x):
            return
        key = (x if self.largest else -x, -index)
        if len(self._heap) < self.k:
            heapq.heappush(self._heap, key)
        elif key > self._heap[0]:
            heapq.heapreplace(self._heap, key)

    def value(self) -> list[tuple[int, float]]:
        """The kept outputs, best first."""
        pairs = [(-i, x if self.largest else -x) for x, i in self._heap]
        return sorted(pairs, key=lambda p: (-p[1] if self.largest else p[1], p[0]))


class Collect:
    """Writes each output to `<directory>/<index>.bin`; the value is the count written."""

    def __init__(self, directory: str | Path) -> None:
        """Create the directory if needed."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def add(self, index: int, output: bytes) -> None:
        """Write one output file."""
        (self.directory / f"{index}.bin").write_bytes(output)
        self.count += 1

    def value(self) -> int:
        """How many outputs were written."""
        return self.count


class Fold:
    """Folds outputs with a user function: `state = fn(state, index, output)`."""

    def __init__(self, fn: Callable[[Any, int, bytes], Any], initial: Any = None) -> None:
        """Start from `initial`."""
        self.fn, self.state = fn, initial

    def add(self, index: int, output: bytes) -> None:
        """Apply the function."""
        self.state = self.fn(self.state, index, output)

    def value(self) -> Any:
        """The folded state."""
        return self.state


def by_name(name: str, directory: str | None = None, k: int = 10) -> Aggregator:
    """An aggregator from its CLI/TOML name: argmin, argmax, mean, topk or collect."""
    if name == "argmin":
        return ArgMin()
    if name == "argmax":
        return ArgMax()
    if name == "mean":
        return Mean()
    if name == "topk":
        return TopK(k)
    if name == "collect":
        if not directory:
            raise ValueError("the collect aggregator needs an output directory")
        return Collect(directory)
    raise ValueError(f"unknown aggregator {name!r}; expected argmin, argmax, mean, topk or collect")
