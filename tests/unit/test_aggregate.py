"""coordinator/aggregate.py: decoding chunk outputs by the job's dtype and folding them."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vramfabric.coordinator.aggregate import (
    ArgMax,
    ArgMin,
    Collect,
    Fold,
    Gather,
    Mean,
    TopK,
    add_run,
    bind_dtype,
    by_name,
)
from vramfabric.coordinator.decoding import decode, scalar

NAN = float("nan")


def f32(x: float) -> bytes:
    return np.float32(x).tobytes()


def feed(agg: Any, pairs: list[tuple[int, float]]) -> Any:
    # Most tests speak float32; an aggregator made without a dtype takes it as the job's
    bind_dtype(agg, "float32")
    for index, x in pairs:
        agg.add(index, f32(x))
    return agg.value()


def test_scalar_reads_the_first_float32() -> None:
    assert scalar(f32(2.5) + f32(9.0), "float32") == 2.5
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
    agg = Fold(lambda state, index, out: [*state, (index, scalar(out, "float32"))], initial=[])
    assert feed(agg, [(2, 1.0), (0, 3.0)]) == [(2, 1.0), (0, 3.0)]


def test_fold_default_initial_is_none() -> None:
    seen: list[Any] = []

    def step(state: Any, index: int, out: Any) -> int:
        seen.append(state)
        return index

    agg = Fold(step)
    feed(agg, [(4, 0.0), (5, 0.0)])
    assert seen == [None, 4]
    assert agg.value() == 5


@pytest.mark.parametrize(
    ("name", "cls"),
    [("argmin", ArgMin), ("argmax", ArgMax), ("mean", Mean), ("topk", TopK), ("gather", Gather)],
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


def test_by_name_leaves_the_dtype_to_the_job() -> None:
    assert by_name("argmin").dtype is None  # type: ignore[attr-defined]


# --- the job's dtype: bind_dtype, explicit dtypes, unbound use


def f64_with_low_word(high: float, low32: float) -> bytes:
    """A float64 near `high` whose first 4 bytes (little-endian) read as the float32 `low32`."""
    hi_bits = int(np.array(high, dtype=np.float64).view(np.uint64)) & ~0xFFFFFFFF
    lo_bits = int(np.array(low32, dtype=np.float32).view(np.uint32))
    return np.array(hi_bits | lo_bits, dtype="<u8").view("<f8").tobytes()


def misread_pair() -> list[tuple[int, bytes]]:
    """Two float64 outputs whose true argmin is index 0 and whose float32 misreading says 1."""
    a = np.float64(1.0).astype("<f8").tobytes()  # low word zero: reads 0.0 as float32
    b = f64_with_low_word(2.0, -1.0)  # ~2.0 as float64, -1.0 as float32
    return [(0, a), (1, b)]


def test_bound_float64_picks_what_a_float32_reading_gets_wrong() -> None:
    # Given float64 outputs built so that their first 4 bytes, read as float32, rank them wrongly
    pairs = misread_pair()
    misread = ArgMin(dtype="float32")
    for index, out in pairs:
        misread.add(index, out)
    assert misread.value() == (1, -1.0)
    # When ArgMin takes the job's float64 dtype
    agg = ArgMin()
    bind_dtype(agg, "float64")
    for index, out in pairs:
        agg.add(index, out)
    # Then it compares whole float64 values
    assert agg.value() == (0, 1.0)


def test_bound_float64_argmax_reads_the_whole_value() -> None:
    agg = ArgMax()
    bind_dtype(agg, "float64")
    for index, out in misread_pair():
        agg.add(index, out)
    best = agg.value()
    assert best is not None
    assert best[0] == 1
    assert best[1] == pytest.approx(2.0)


def test_explicit_dtype_wins_over_bind_dtype() -> None:
    agg = ArgMin(dtype="float32")
    bind_dtype(agg, "float64")
    assert agg.dtype == "float32"
    agg.add(0, f32(1.5))
    assert agg.value() == (0, 1.5)


def test_bind_dtype_ignores_aggregators_without_a_dtype(tmp_path: Path) -> None:
    collect, fold = Collect(tmp_path), Fold(lambda s, i, o: o)
    bind_dtype(collect, "float64")
    bind_dtype(fold, "pickle")
    assert not hasattr(collect, "dtype")
    assert not hasattr(fold, "dtype")


@pytest.mark.parametrize("make", [ArgMin, ArgMax, Mean, lambda: TopK(2), Gather])
def test_unbound_aggregator_raises_on_add(make: Any) -> None:
    agg = make()
    with pytest.raises(ValueError, match=r"no dtype: pass .*\(dtype=\.\.\.\) or call bind_dtype"):
        agg.add(0, f32(1.0))


@pytest.mark.parametrize("bad", ["float33", "object", "S0"])
def test_unknown_dtypes_fail_early(bad: str) -> None:
    with pytest.raises(ValueError, match=repr(bad)):
        ArgMin(dtype=bad)
    with pytest.raises(ValueError, match=repr(bad)):
        bind_dtype(Mean(), bad)


# --- pickled outputs of Python-callable jobs


def pk(obj: Any) -> bytes:
    return pickle.dumps(obj)


def test_pickle_outputs_for_argmin_and_argmax() -> None:
    outs = [(0, pk(3)), (1, pk(-2.5)), (2, pk(np.float64(7.0))), (3, pk(float("nan")))]
    for cls, want in [(ArgMin, (1, -2.5)), (ArgMax, (2, 7.0))]:
        agg = cls()
        bind_dtype(agg, "pickle")
        for index, out in outs:
            agg.add(index, out)
        assert agg.value() == want


def test_pickle_outputs_for_mean() -> None:
    agg = Mean(dtype="pickle")
    for index, x in enumerate([1, 2.5, np.float32(4.5), True]):
        agg.add(index, pk(x))
    assert agg.value() == 9.0 / 4


def test_pickle_outputs_for_topk() -> None:
    agg = TopK(2, largest=True)
    bind_dtype(agg, "pickle")
    for index, x in [(0, 1), (1, 10**3), (2, 5.5), (3, np.int64(10**3))]:
        agg.add(index, pk(x))
    assert agg.value() == [(1, 1000.0), (3, 1000.0)]


@pytest.mark.parametrize("obj", ["1.5", b"1", None, [1.0], {"loss": 1.0}, 1j])
def test_pickle_output_that_is_not_a_number_raises(obj: Any) -> None:
    with pytest.raises(ValueError, match=f"pickled output is a {type(obj).__name__}, not a number"):
        scalar(pk(obj), "pickle")


def test_output_that_is_not_a_pickle_raises() -> None:
    with pytest.raises(ValueError, match="output of 3 bytes is not a pickle"):
        scalar(b"abc", "pickle")


# --- scalar decoding errors


@pytest.mark.parametrize(
    ("output", "dtype", "message"),
    [
        (b"", "float32", "output of 0 bytes is shorter than one float32 (4 bytes)"),
        (f32(1.0), "float64", "output of 4 bytes is shorter than one float64 (8 bytes)"),
        (b"\x01", "int16", "output of 1 bytes is shorter than one int16 (2 bytes)"),
    ],
)
def test_short_output_error_names_the_sizes(output: bytes, dtype: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        scalar(output, dtype)


def test_scalar_of_raw_bytes_raises() -> None:
    with pytest.raises(ValueError, match="'bytes' have no scalar value"):
        scalar(b"abcd", "bytes")


def test_scalar_reads_integers() -> None:
    assert scalar(np.int64(-7).tobytes(), "int64") == -7.0


# --- Gather


def gather(dtype: str, outputs: list[tuple[int, bytes]], **kw: Any) -> list[Any]:
    agg = Gather(**kw)
    bind_dtype(agg, dtype)
    for index, out in outputs:
        agg.add(index, out)
    return agg.value()


def test_gather_pickle_in_index_order_with_gaps() -> None:
    # Given chunks 0, 1 and 3 arriving out of order, chunk 2 failed (never added)
    out = gather("pickle", [(3, pk({"d": 3})), (0, pk([0])), (1, pk(None))])
    # Then the list is in index order, None for the gap (and for a chunk that returned None)
    assert out == [[0], None, None, {"d": 3}]


def test_gather_bytes_are_raw() -> None:
    assert gather("bytes", [(1, b"one"), (0, b"")]) == [b"", b"one"]


def test_gather_numeric_gives_writable_arrays() -> None:
    out = gather("float32", [(1, f32(2.0)), (0, f32(0.5) + f32(1.5))])
    assert [a.tolist() for a in out] == [[0.5, 1.5], [2.0]]
    assert all(a.dtype == np.float32 for a in out)
    out[0][0] = 9.0  # a copy, not a view of the immutable output bytes
    assert out[0][0] == 9.0


def test_gather_explicit_dtype_and_n_chunks_pad_trailing_failures() -> None:
    agg = Gather(dtype="bytes", n_chunks=4)
    bind_dtype(agg, "pickle")
    agg.add(1, b"x")
    assert agg.value() == [None, b"x", None, None]


def test_gather_of_nothing_is_empty() -> None:
    assert Gather(dtype="pickle").value() == []


def test_decode_rejects_a_partial_element() -> None:
    with pytest.raises(ValueError, match=r"output of 6 bytes is not a whole number of float32"):
        decode(b"\x00" * 6, "float32")


RUNS: list[tuple[str, list[object]]] = [
    ("pickle", [3.5, 1.0, NAN, 1.0, -2, True, 7]),  # ints, a bool, a tie, a NaN
    ("pickle", [NAN, NAN]),
    ("pickle", [2**70, 5.0]),  # an int past int64: read one by one, as `add` reads it
    ("float32", [1.5, -0.25, -0.25, NAN]),
    ("int64", [4, -9, 12]),
    # floats alone, pickled as executors pickle them: read from the joined bytes at once
    ("pickle5", [0.75, -0.0, float("inf"), NAN, 0.25, 0.25, -1e300]),
    ("pickle5", [NAN, NAN]),
    # a 21-byte pickle that is no float among floats (an int of 7 bytes): one by one
    ("pickle5", [0.75, 2**50, 0.25]),
]


def _outputs(dtype: str, values: list[object]) -> list[bytes]:
    if dtype == "pickle":
        return [pickle.dumps(v) for v in values]
    if dtype == "pickle5":
        return [pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL) for v in values]
    return [np.array([v], dtype=dtype).tobytes() for v in values]


@pytest.mark.parametrize("cls", [ArgMin, ArgMax])
@pytest.mark.parametrize(("dtype", "values"), RUNS)
def test_a_run_folded_at_once_gives_what_one_by_one_gives(
    cls: type, dtype: str, values: list[object]
) -> None:
    # Given two aggregators with a best so far, and a run of outputs after it
    outputs = _outputs(dtype, values)
    dtype = "pickle" if dtype == "pickle5" else dtype
    one, run = cls(dtype=dtype), cls(dtype=dtype)
    for agg in (one, run):
        agg.add(0, _outputs(dtype, [0.5])[0])
    # When one folds the run chunk by chunk and the other at once (add_run)
    for index, output in enumerate(outputs, 10):
        one.add(index, output)
    add_run(run, 10, outputs)
    # Then both hold the same best: NaN never wins, ties go to the lower index
    assert run.value() == one.value()


def test_a_run_with_an_output_that_is_no_number_fails_as_one_by_one_does() -> None:
    # Given runs with an output that is a string, or an int past float64
    for bad in ("3.0", 2**1100):
        outputs = [pickle.dumps(v) for v in (1.0, bad)]
        # Then folding it at once raises the same error as folding that chunk would
        with pytest.raises(ValueError, match=f"pickled output is a {type(bad).__name__}"):
            add_run(ArgMin(dtype="pickle"), 0, outputs)
        with pytest.raises(ValueError, match=f"pickled output is a {type(bad).__name__}"):
            ArgMin(dtype="pickle").add(1, outputs[1])


def test_aggregators_without_add_run_get_each_output_in_order() -> None:
    # Given a fold that records what it sees, and a run of outputs
    seen: list[tuple[int, bytes]] = []
    fold = Fold(lambda state, index, output: seen.append((index, output)))
    # When the run is folded
    add_run(fold, 5, [b"a", b"b", b"c"])
    # Then it saw each output with its own index, in order
    assert seen == [(5, b"a"), (6, b"b"), (7, b"c")]


def test_a_subclass_that_overrides_add_sees_every_output_of_a_run() -> None:
    # Given an ArgMin subclass that counts the outputs its `add` sees (not `add_run`)
    class Counting(ArgMin):
        def __init__(self) -> None:
            super().__init__(dtype="pickle")
            self.seen: list[int] = []

        def add(self, index: int, output: bytes) -> None:
            self.seen.append(index)
            super().add(index, output)

    agg = Counting()
    # When a run is folded
    add_run(agg, 3, [pickle.dumps(v) for v in (2.0, 1.0, 5.0)])
    # Then its add saw each chunk once, and the best is right
    assert agg.seen == [3, 4, 5] and agg.value() == (4, 1.0)
