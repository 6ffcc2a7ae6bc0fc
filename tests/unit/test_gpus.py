"""worker/node/gpus.py: sizes and simulated fleets from text."""

from __future__ import annotations

import pytest

from vramfabric.broker.settings import parse_size
from vramfabric.worker.node.gpus import GpuSpec, parse_simulate


@pytest.mark.parametrize(
    ("text", "n_bytes"),
    [
        ("512MiB", 512 * 2**20),
        ("48GiB", 48 * 2**30),
        ("1.5GB", 1_500_000_000),
        ("1.5GiB", 3 * 2**29),
        ("4096", 4096),
        ("1", 1),
        ("10B", 10),
        ("1KB", 1000),
        ("1KiB", 1024),
        ("2MB", 2_000_000),
        ("1TB", 10**12),
        ("1TiB", 2**40),
        ("2gib", 2 * 2**30),
        (" 2 GiB ", 2 * 2**30),
    ],
)
def test_parse_size(text: str, n_bytes: int) -> None:
    assert parse_size(text) == n_bytes


@pytest.mark.parametrize(
    "text", ["", "   ", "abc", "GiB", "-1GiB", "1.5.2GB", "1XB", "1 G i B", "1e9", "1,5GB", "0x10"]
)
def test_parse_size_rejects_non_sizes_with_a_hint(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_size(text)
    assert f"not a size: {text!r}" in str(info.value)
    assert "512MiB" in str(info.value)


@pytest.mark.parametrize("text", ["0", "0GiB", "0.0MB", "0.4B"])
def test_parse_size_rejects_zero(text: str) -> None:
    with pytest.raises(ValueError, match=f"size must be positive: {text!r}"):
        parse_size(text)


def test_parse_simulate_builds_that_many_simulated_gpus() -> None:
    gpus = parse_simulate("4x48GiB")
    assert gpus == tuple(GpuSpec(i, "simulated", 48 * 2**30, simulated=True) for i in range(4))
    assert [g.index for g in gpus] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("spec", "count", "size"),
    [
        ("1X512MiB", 1, 512 * 2**20),
        (" 2 x 1GiB", 2, 2**30),
        ("64x1GiB", 64, 2**30),
        ("3x1000", 3, 1000),
    ],
)
def test_parse_simulate_forms(spec: str, count: int, size: int) -> None:
    gpus = parse_simulate(spec)
    assert len(gpus) == count
    assert all(g.total_bytes == size and g.simulated for g in gpus)


@pytest.mark.parametrize("spec", ["", "48GiB", "x48GiB", "4x", "-1x1GiB", "fourx1GiB", "4*1GiB"])
def test_parse_simulate_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="not a simulate spec"):
        parse_simulate(spec)


@pytest.mark.parametrize("spec", ["0x1GiB", "65x1GiB"])
def test_parse_simulate_rejects_counts_outside_1_to_64(spec: str) -> None:
    with pytest.raises(ValueError, match=r"simulated GPU count must be 1\.\.64"):
        parse_simulate(spec)


@pytest.mark.parametrize("spec", ["4xlots", "4x0GiB", "4x 1XB"])
def test_parse_simulate_rejects_bad_sizes(spec: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_simulate(spec)


def test_gpu_spec_defaults_to_simulated() -> None:
    assert GpuSpec(0, "m", 1).simulated is True
