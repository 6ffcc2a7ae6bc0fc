"""The aggregators of the built-in kernels' patterns: MeanCI, Concat and TileImage."""

from __future__ import annotations

import numpy as np
import pytest

from vramfabric.coordinator.aggregate import bind_dtype
from vramfabric.coordinator.patterns import Concat, MeanCI, TileImage


def test_mean_ci_gives_the_scaled_mean_and_a_normal_interval() -> None:
    # Given four chunks' hit counts as uint64 and a scale of 1/10
    agg = MeanCI(dtype="uint64", scale=0.1)
    for i, hits in enumerate([10, 20, 30, 40]):
        agg.add(i, np.array([hits, 99], np.uint64).tobytes())
    # Then the mean is of the scaled first elements and the half-width is 1.96 s / sqrt(n)
    interval = agg.value()
    assert interval is not None and interval.count == 4
    assert interval.mean == pytest.approx(2.5)
    half = 1.96 * np.std([1.0, 2.0, 3.0, 4.0], ddof=1) / 2
    assert interval.half_width == pytest.approx(half)
    assert (interval.low, interval.high) == pytest.approx((2.5 - half, 2.5 + half))


def test_mean_ci_of_nothing_is_none_and_of_one_output_has_no_width() -> None:
    agg = MeanCI(dtype="float64")
    assert agg.value() is None
    agg.add(0, np.float64(3.0).tobytes())
    value = agg.value()
    assert value is not None and (value.mean, value.half_width) == (3.0, 0.0)


def test_mean_ci_takes_the_jobs_dtype() -> None:
    agg = MeanCI()
    bind_dtype(agg, "uint64")
    agg.add(0, np.array([7, 0], np.uint64).tobytes())
    assert agg.value() is not None and agg.value().mean == 7.0  # type: ignore[union-attr]


def test_concat_joins_outputs_in_chunk_order_whatever_the_arrival_order() -> None:
    agg = Concat(dtype="float32")
    for i in (2, 0, 1):
        agg.add(i, np.full(3, i, np.float32).tobytes())
    np.testing.assert_array_equal(agg.value(), np.repeat(np.arange(3, dtype=np.float32), 3))
    assert agg.missing() == []


def test_concat_leaves_failed_chunks_out_and_names_them() -> None:
    agg = Concat(dtype="int32", n_chunks=4)
    agg.add(1, np.array([5], np.int32).tobytes())
    np.testing.assert_array_equal(agg.value(), [5])
    assert agg.missing() == [0, 2, 3]
    assert Concat(dtype="int32").value().size == 0


def test_tile_image_places_each_tile_by_its_index() -> None:
    # Given a 2 x 3 grid of 2 x 2 tiles, tile i filled with i, arriving in any order
    agg = TileImage(grid=(2, 3), tile=(2, 2), dtype="uint32")
    for i in (5, 0, 3, 1, 4, 2):
        agg.add(i, np.full(4, i, np.uint32).tobytes())
    image = agg.value()
    # Then tile i sits at row i // 3, column i % 3
    assert image is not None and image.shape == (4, 6) and image.dtype == np.uint32
    np.testing.assert_array_equal(image[::2, ::2], [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(image[2:, 4:], np.full((2, 2), 5))


def test_tile_image_refuses_tiles_outside_the_grid_or_of_the_wrong_size() -> None:
    agg = TileImage(grid=(1, 2), tile=(2, 2), dtype="uint8")
    with pytest.raises(ValueError, match="outside a grid"):
        agg.add(2, bytes(4))
    with pytest.raises(ValueError, match="not 2 x 2"):
        agg.add(0, bytes(3))
    with pytest.raises(ValueError, match="positive"):
        TileImage(grid=(0, 1), tile=(1, 1))
    assert agg.value() is None
