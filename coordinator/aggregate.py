"""Aggregators: fold chunk outputs as they stream in.

Each receives `add(index, output)` once per chunk that succeeded, in arrival order, and
`value()` gives the aggregate. Ties go to the lower chunk index, so the answer does not
depend on which worker finished first. All but `Gather` hold bounded state; `Gather` keeps
every decoded output in memory. The aggregators of the built-in CUDA kernels' patterns are in
coordinator/patterns.py. An aggregator may also have `add_run(first, outputs)`, which folds
chunks `first`, `first + 1`, ... at once as `add` would one by one (`add_run` below).

Outputs are decoded by a dtype: a numeric numpy dtype name (`float32`, `float64`, `int64`...),
`bytes` (raw), or `pickle` (a Python-callable job's `pickle.dumps` of its return value).
ArgMin, ArgMax, Mean, TopK and Gather default to `dtype=None`, meaning "the job's declared
output dtype": the coordinator calls `bind_dtype(aggregator, dtype)` before the first result,
and a dtype given explicitly wins. Outputs are read in coordinator/decoding.py.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .decoding import check_dtype, decode, scalar, scalars


class Aggregator(Protocol):
    """Folds chunk outputs into one value."""

    def add(self, index: int, output: bytes) -> None:
        """Fold one chunk's output in."""
        ...

    def value(self) -> Any:
        """The aggregate so far."""
        ...


def bind_dtype(aggregator: Aggregator, dtype: str) -> None:
    """Give `aggregator` the job's output dtype unless it already has one."""
    # Only decoding aggregators have a `dtype`; Collect and Fold see raw bytes whatever the job
    # declares. An explicit dtype is never overwritten.
    if getattr(aggregator, "dtype", "") is None:
        aggregator.dtype = check_dtype(dtype)  # type: ignore[attr-defined]


def bound_dtype(agg: Any) -> str:
    """The aggregator's dtype, or ValueError if it was never given or bound."""
    dtype: str | None = agg.dtype
    if dtype is None:
        name = type(agg).__name__
        raise ValueError(
            f"{name} has no dtype: pass {name}(dtype=...) or call bind_dtype(aggregator, "
            "job_output_dtype) before the first result"
        )
    return dtype


def optional_dtype(dtype: str | None) -> str | None:
    """An explicit dtype checked early, so a typo fails before the job runs."""
    return None if dtype is None else check_dtype(dtype)


class ArgMin:
    """The chunk with the smallest scalar output: `(index, value)` or None."""

    def __init__(self, dtype: str | None = None) -> None:
        """Compare outputs decoded as `dtype` (None: the job's output dtype, see bind_dtype)."""
        self.dtype = optional_dtype(dtype)
        self.best: tuple[float, int] | None = None

    def add(self, index: int, output: bytes) -> None:
        """Keep the output if it is the smallest seen (NaN never wins)."""
        x = scalar(output, bound_dtype(self))
        if not math.isnan(x) and (self.best is None or (x, index) < self.best):
            self.best = (x, index)

    def add_run(self, first: int, outputs: Sequence[bytes]) -> None:
        """Fold chunks `first`, `first + 1`, ... at once, as `add` would each."""
        self._keep(first, scalars(outputs, bound_dtype(self)))

    def _keep(self, first: int, xs: np.ndarray[Any, np.dtype[np.float64]]) -> None:
        """Keep the smallest of `xs` (chunks `first`, ...) if it beats the best; NaN never wins."""
        nan = np.isnan(xs)
        if len(xs) and not nan.all():
            # The first of equal smallest: the lowest index (nanargmin only where NaN is).
            i = int(np.nanargmin(xs) if nan.any() else xs.argmin())
            candidate = (float(xs[i]), first + i)
            if self.best is None or candidate < self.best:
                self.best = candidate

    def value(self) -> tuple[int, float] | None:
        """(index, value) of the best chunk."""
        return None if self.best is None else (self.best[1], self.best[0])


class ArgMax(ArgMin):
    """The chunk with the largest scalar output: `(index, value)` or None."""

    def add(self, index: int, output: bytes) -> None:
        """Keep the output if it is the largest seen (NaN never wins)."""
        x = -scalar(output, bound_dtype(self))
        if not math.isnan(x) and (self.best is None or (x, index) < self.best):
            self.best = (x, index)

    def add_run(self, first: int, outputs: Sequence[bytes]) -> None:
        """Fold chunks `first`, `first + 1`, ... at once, as `add` would each."""
        self._keep(first, -scalars(outputs, bound_dtype(self)))

    def value(self) -> tuple[int, float] | None:
        """(index, value) of the best chunk."""
        return None if self.best is None else (self.best[1], -self.best[0])


class Mean:
    """Mean and count of scalar outputs (float64 accumulation)."""

    def __init__(self, dtype: str | None = None) -> None:
        """Average outputs decoded as `dtype` (None: the job's output dtype, see bind_dtype)."""
        self.dtype = optional_dtype(dtype)
        self.total = 0.0
        self.count = 0

    def add(self, index: int, output: bytes) -> None:
        """Add one output to the running sum."""
        self.total += scalar(output, bound_dtype(self))
        self.count += 1

    def value(self) -> float | None:
        """The mean, or None before any output."""
        return self.total / self.count if self.count else None


class TopK:
    """The k smallest (or largest) scalar outputs as sorted `(index, value)` pairs."""

    def __init__(self, k: int, largest: bool = False, dtype: str | None = None) -> None:
        """Keep `k` outputs; `largest` picks the top instead of the bottom."""
        if k <= 0:
            raise ValueError(f"k must be > 0, got {k}")
        self.k, self.largest, self.dtype = k, largest, optional_dtype(dtype)
        self._heap: list[tuple[float, int]] = []  # worst kept on top

    def add(self, index: int, output: bytes) -> None:
        """Keep the output if it ranks among the best k."""
        x = scalar(output, bound_dtype(self))
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


class Gather:
    """Every chunk's decoded output as a list in chunk-index order; holds them all in memory."""

    def __init__(self, dtype: str | None = None, n_chunks: int | None = None) -> None:
        """Decode outputs as `dtype` (None: the job's output dtype); `n_chunks` pads the list."""
        self.dtype = optional_dtype(dtype)
        self.n_chunks = n_chunks
        self._outputs: dict[int, Any] = {}

    def add(self, index: int, output: bytes) -> None:
        """Decode and keep one output (pickle: object, bytes: bytes, numeric: numpy array)."""
        self._outputs[index] = decode(output, bound_dtype(self))

    def value(self) -> list[Any]:
        """Outputs by chunk index, None where a chunk has no ok output."""
        # Without n_chunks the length is the highest index seen plus one, so trailing chunks that
        # failed are absent rather than None.
        size = max(self._outputs, default=-1) + 1
        if self.n_chunks is not None:
            size = max(size, self.n_chunks)
        return [self._outputs.get(i) for i in range(size)]


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


def add_run(aggregator: Aggregator, first: int, outputs: Sequence[bytes]) -> None:
    """Fold chunks `first`, `first + 1`, ...: at once if the aggregator can, else one by one.

    A subclass that overrides `add` but not `add_run` sees every output in its `add`.
    """
    fold = getattr(aggregator, "add_run", None)
    cls = type(aggregator)
    if fold is not None and issubclass(_owner(cls, "add_run"), _owner(cls, "add")):
        fold(first, outputs)
        return
    for index, output in enumerate(outputs, first):
        aggregator.add(index, output)


def _owner(cls: type, name: str) -> type:
    """The class in `cls`'s MRO that defines `name`."""
    return next(c for c in cls.__mro__ if name in vars(c))


def by_name(name: str, directory: str | None = None, k: int = 10) -> Aggregator:
    """An aggregator from its CLI/TOML name: argmin, argmax, mean, topk, gather or collect."""
    if name == "argmin":
        return ArgMin()
    if name == "argmax":
        return ArgMax()
    if name == "mean":
        return Mean()
    if name == "topk":
        return TopK(k)
    if name == "gather":
        return Gather()
    if name == "collect":
        if not directory:
            raise ValueError("the collect aggregator needs an output directory")
        return Collect(directory)
    raise ValueError(
        f"unknown aggregator {name!r}; expected argmin, argmax, mean, topk, gather or collect"
    )
