"""Aggregators of the built-in CUDA kernels' patterns (the fitness pattern uses `TopK`).

A Monte Carlo mean with its confidence interval, inference outputs joined in chunk order, and
image tiles assembled into one array. They follow `aggregate.Aggregator`.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from .aggregate import Gather, bound_dtype, optional_dtype
from .decoding import decode, numpy_dtype, scalar


@attrs.frozen
class MeanInterval:
    """A mean with its normal-approximation confidence interval: mean +- half_width."""

    mean: float
    half_width: float
    count: int

    @property
    def low(self) -> float:
        """The interval's lower end."""
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        """The interval's upper end."""
        return self.mean + self.half_width


class MeanCI:
    """Mean of scaled scalar outputs with a confidence interval (Monte Carlo estimates)."""

    def __init__(self, dtype: str | None = None, scale: float = 1.0, z: float = 1.96) -> None:
        """Average `scale` times each output's first element; `z` sets the level (1.96: 95%)."""
        self.dtype = optional_dtype(dtype)
        self.scale, self.z = scale, z
        self.count, self._mean, self._m2 = 0, 0.0, 0.0

    def add(self, index: int, output: bytes) -> None:
        """Fold one estimate in (Welford's update: no catastrophic cancellation)."""
        x = self.scale * scalar(output, bound_dtype(self))
        self.count += 1
        delta = x - self._mean
        self._mean += delta / self.count
        self._m2 += delta * (x - self._mean)

    def value(self) -> MeanInterval | None:
        """The mean and the half-width z * s / sqrt(n) (0 for one output), or None."""
        if not self.count:
            return None
        variance = self._m2 / (self.count - 1) if self.count > 1 else 0.0
        return MeanInterval(self._mean, self.z * math.sqrt(variance / self.count), self.count)


class Concat(Gather):
    """Every chunk's decoded output joined into one array in chunk-index order."""

    def value(self) -> Any:
        """One numpy array; chunks without an ok output are left out (see `missing`)."""
        parts = [out for out in super().value() if out is not None]
        return np.concatenate(parts) if parts else np.empty(0, numpy_dtype(bound_dtype(self)))

    def missing(self) -> list[int]:
        """Indices below the highest seen (or `n_chunks`) that have no output."""
        return [i for i, out in enumerate(super().value()) if out is None]


class TileImage:
    """An image assembled from tiles: chunk i is tile (i // columns, i % columns), row-major."""

    def __init__(
        self, grid: tuple[int, int], tile: tuple[int, int], dtype: str | None = None
    ) -> None:
        """`grid` is (rows, columns) of tiles, `tile` each tile's (height, width) in pixels."""
        if min(*grid, *tile) <= 0:
            raise ValueError(f"grid {grid} and tile {tile} must be positive")
        self.grid, self.tile, self.dtype = grid, tile, optional_dtype(dtype)
        self._image: np.ndarray | None = None

    def add(self, index: int, output: bytes) -> None:
        """Place one tile (the output's first height * width items) in the image."""
        rows, columns = self.grid
        if not 0 <= index < rows * columns:
            raise ValueError(f"tile {index} outside a grid of {rows} x {columns}")
        height, width = self.tile
        pixels = decode(output, bound_dtype(self))[: height * width]
        if pixels.size != height * width:
            raise ValueError(f"tile {index} has {pixels.size} items, not {height} x {width}")
        image = self._canvas(pixels.dtype)
        top, left = (index // columns) * height, (index % columns) * width
        image[top : top + height, left : left + width] = pixels.reshape(height, width)

    def value(self) -> np.ndarray | None:
        """The image so far (tiles not yet added are zeros), or None before the first tile."""
        return self._image

    def _canvas(self, dtype: np.dtype[Any]) -> np.ndarray:
        if self._image is None:
            rows, columns = self.grid
            self._image = np.zeros((rows * self.tile[0], columns * self.tile[1]), dtype=dtype)
        return self._image
