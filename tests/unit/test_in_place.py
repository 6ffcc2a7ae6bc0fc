"""fabric/in_place.py: a notebook run's kernel uses the slice it runs on, without the fabric."""

from __future__ import annotations

from typing import Any

import pytest

import vramfabric
from vramfabric.broker.errors import ChunkFailed
from vramfabric.in_place import InPlaceFabric, InPlaceSettings

SLICE = InPlaceSettings(slice_bytes=2**30, device=None, node="n7", job="_gpu_abc")


def size_and_module(ctx: Any) -> tuple[int, str]:
    return ctx.slice_bytes, ctx.xp.__name__


def not_two(x: int) -> int:
    if x == 2:
        raise ValueError("two")
    return x


def test_connect_in_a_notebook_run_is_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the environment a notebook run gives its kernel
    for name, value in SLICE.to_env().items():
        monkeypatch.setenv(name, value)
    # When the notebook connects, then it gets the slice it runs on, and no fabric
    fabric = vramfabric.connect()
    assert isinstance(fabric, InPlaceFabric) and fabric.settings == SLICE
    assert InPlaceSettings.from_env({}).active is False


async def test_blocks_and_maps_run_here_with_the_slices_context() -> None:
    fabric = InPlaceFabric(SLICE)
    with fabric.gpu(vram="8GiB") as gpu:
        assert gpu.node == "n7"
        assert gpu.run(size_and_module, timeout_s=5) == (2**30, "numpy")
    async with fabric.gpu() as agpu:
        assert await agpu.run_async(sorted, [3, 1]) == [1, 3]
    assert list(fabric.map(not_two, [0, 1])) == [0, 1]
    assert [x async for x in fabric.map(not_two, [1])] == [1]
    with pytest.raises(ChunkFailed, match="item 2: ValueError"):
        list(fabric.map(not_two, range(4)))


def test_batch_jobs_are_refused_in_place_with_a_reason() -> None:
    with pytest.raises(RuntimeError, match="runs in place on one slice"):
        InPlaceFabric(SLICE).run(object(), object())
