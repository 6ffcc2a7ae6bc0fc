"""coordinator/aggregate.py: folding float32 chunk outputs as they stream in."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vramfabric.coordinator.aggregate import (
    ArgMax,
    ArgMin,
    Collect,
    Fold,
    Mean,
    TopK,
    by_name,
    scalar,
)

NAN = float("nan")


def f32(x: float) -> bytes:
    return np.float32(x).tobytes()


def feed(agg: Any, pairs: list[tuple[int, float]]) -> Any:
    for index, x in pairs:
        agg.add(index, f32(x))
    return agg.value()


def test_scalar_reads_the_first_float32() -> None:
    assert scalar(f32(2.5) + f32(9.0)) == 2.5
    assert scalar(np.float64(1.25).tobytes(), "float64") == 1.25


def test_argmin_finds_the_smallest() -> None:
    assert feed(ArgMin(), [(0, 3.0), (1, -2.0), (2, 5.0)]) == (1, -2.0)


def test_argmax_finds_the_largest() -> None:
    assert feed(ArgMax(), [(0, 3.0), (1, -2.0), (2, 5.0)]) == (2, 5.0)


@pytest.mark.parametrize("cls", [ArgMin, ArgMax])
def test_ties_go_to_the_lower_index_whatever_the_arrival_order(cls: type) -> None:
    # Given three chunks with equal outputs, and a worse one
    worse = 9.0 if cls is ArgMin else -9.0
    pairs = [(5, 1.0), (2, 1.0), (7, 1.0), (0, worse)]
    # When they arrive in every possible order
    answers = {feed(cls(), list(order)) for order in itertools.permutations(pairs)}
    # Then the answer is always the lowest index among the best
    assert answers == {(2, 1.0)}


@pytest.mark.parametrize("cls", [ArgMin, ArgMax])
def test_nan_never_wins(cls: type) -> None:
    assert feed(cls(), [(0, NAN), (1, 4.0), (2, NAN)]) == (1, 4.0)
    assert feed(cls(), [(1, 4.0), (0, NAN)]) == (1, 4.0)
    assert feed(cls(), [(0, NAN)]) is None


@pytest.mark.parametrize("cls", [ArgMin, ArgMax])
def test_nothing_added_gives_none(cls: type) -> None:
    assert cls().value() is None


def test_infinities_compare_as_numbers() -> None:
    pairs = [(0, 1.0), (1, float("-inf")), (2, float("inf"))]
    assert feed(ArgMin(), pairs) == (1, float("-inf"))
    assert feed(ArgMax(), pairs) == (2, float("inf"))


def test_values_are_read_as_float32() -> None:
    index, value = feed(ArgMin(), [(3, 0.1)])
    assert index == 3
    assert value == float(np.float32(0.1))
    assert value != 0.1


def test_mean_and_count() -> None:
    mean = Mean()
    assert mean.value() is None
    assert feed(mean, [(0, 1.0), (1, 2.0), (2, 6.0)]) == 3.0
    assert mean.count == 3


def test_mean_accumulates_in_float64() -> None:
    # 2**24 + 1 is not a float32, but the sum of float32 values must not lose the ones
    mean = Mean()
    feed(mean, [(0, 2.0**24)] + [(i, 1.0) for i in range(1, 101)])
    assert mean.total == 2.0**24 + 100


def test_topk_smallest_best_first() -> None:
    out = feed(TopK(2), [(0, 5.0), (1, 1.0), (2, 3.0), (3, 0.5)])
    assert out == [(3, 0.5), (1, 1.0)]


def test_topk_largest_best_first() -> None:
    out = feed(TopK(2, largest=True), [(0, 5.0), (1, 1.0), (2, 3.0), (3, 0.5)])
    assert out == [(0, 5.0), (2, 3.0)]


@pytest.mark.parametrize("largest", [False, True])
def test_topk_keeps_at_most_k(largest: bool) -> None:
    agg = TopK(3, largest=largest)
    feed(agg, [(i, float(i % 7)) for i in range(50)])
    assert len(agg.value()) == 3


def test_topk_with_fewer_than_k_returns_all_sorted() -> None:
    assert feed(TopK(10), [(4, 2.0), (1, 1.0)]) == [(1, 1.0), (4, 2.0)]


@pytest.mark.parametrize("largest", [False, True])
def test_topk_ties_keep_lower_indices_first_whatever_the_arrival_order(largest: bool) -> None:
    # Given five equal outputs and k=3
    pairs = [(4, 1.0), (2, 1.0), (0, 1.0), (3, 1.0), (1, 1.0)]
    # When they arrive in every possible order
    answers = {
        tuple(feed(TopK(3, largest=largest), list(p))) for p in itertools.permutations(pairs)
    }
    # Then the lowest three indices are kept, in index order
    assert answers == {((0, 1.0), (1, 1.0), (2, 1.0))}


@pytest.mark.parametrize("largest", [False, True])
def test_topk_mixed_ties_sort_by_value_then_index(largest: bool) -> None:
    pairs = [(9, 2.0), (3, 1.0), (5, 2.0), (1, 1.0), (7, 3.0)]
    out = feed(TopK(4, largest=largest), pairs)
    if largest:
        assert out == [(7, 3.0), (5, 2.0), (9, 2.0), (1, 1.0)]
    else:
        assert out == [(1, 1.0), (3, 1.0), (5, 2.0), (9, 2.0)]


def test_topk_skips_nan() -> None:
    assert feed(TopK(2), [(0, NAN), (1, 3.0), (2, NAN)]) == [(1, 3.0)]
    assert feed(TopK(2, largest=True), [(0, NAN)]) == []


@pytest.mark.parametrize("k", [0, -1])
def test_topk_needs_positive_k(k: int) -> None:
    with pytest.raises(ValueError, match="k must be > 0"):
        TopK(k)


def test_collect_writes_one_file_per_index(tmp_path: Path) -> None:
    # Given a directory that does not exist yet
    out = tmp_path / "nested" / "out"
    agg = Collect(out)
    assert out.is_dir()
    # When outputs arrive out of order
    agg.add(7, b"seven")
    agg.add(0, f32(1.5))
    # Then each is written as <index>.bin and counted
    assert (out / "7.bin").read_bytes() == b"seven"
    assert (out / "0.bin").read_bytes() == f32(1.5)
    assert sorted(p.name for p in out.iterdir()) == ["0.bin", "7.bin"]
    assert agg.value() == 2


def test_collect_accepts_an_existing_directory(tmp_path: Path) -> None:
    Collect(str(tmp_path)).add(1, b"x")
    assert (tmp_path / "1.bin").read_bytes() == b"x"


def test_fold_applies_the_function_from_the_initial_state() -> None:
    agg = Fold(lambda state, index, out: [*state, (index, scalar(out))], initial=[])
    assert feed(agg, [(2, 1.0), (0, 3.0)]) == [(2, 1.0), (0, 3.0)]


def test_fold_default_initial_is_none() -> None:
    seen: list[Any] = []
    agg = Fold(lambda state, index, out: seen.append(state) or index)
    feed(agg, [(4, 0.0), (5, 0.0)])
    assert seen == [None, 4]
    assert agg.value() == 5


@pytest.mark.parametrize(
    ("name", "cls"), [("argmin", ArgMin), ("argmax", ArgMax), ("mean", Mean), ("topk", TopK)]
)
def test_by_name(name: str, cls: type) -> None:
    assert type(by_name(name)) is cls


def test_by_name_topk_uses_k() -> None:
    agg = by_name("topk", k=2)
    assert isinstance(agg, TopK)
    assert agg.k == 2


def test_by_name_collect_uses_directory(tmp_path: Path) -> None:
    agg = by_name("collect", directory=str(tmp_path / "c"))
    assert isinstance(agg, Collect)
    assert agg.directory == tmp_path / "c"


@pytest.mark.parametrize("directory", [None, ""])
def test_by_name_collect_without_directory_raises(directory: str | None) -> None:
    with pytest.raises(ValueError, match="needs an output directory"):
        by_name("collect", directory=directory)


@pytest.mark.parametrize("name", ["median", "", "ArgMin"])
def test_by_name_unknown_raises(name: str) -> None:
    with pytest.raises(ValueError, match=f"unknown aggregator {name!r}"):
        by_name(name)
