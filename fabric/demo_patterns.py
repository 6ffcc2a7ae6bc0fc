"""The demo's patterns: a built-in CUDA kernel, its inputs, its aggregator and the check.

`vramfabric demo --kernel NAME` runs one (fabric/demo.py); each answer is checked against
the kernel's NumPy reference run directly, with no fabric involved.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from vramfabric.coordinator.aggregate import Aggregator, TopK
from vramfabric.coordinator.patterns import Concat, MeanCI, TileImage
from vramfabric.kernels import CudaKernel, fitness, inference, montecarlo, tiles

_RNG_SEED = 16
_MC_CHUNKS, _INFERENCE_CHUNKS, _TILES_SIDE, _FITNESS_CHUNKS, _TOP_K = 200, 16, 8, 64, 5
# How many chunks each pattern runs (for a progress bar).
CHUNKS = {
    "montecarlo": _MC_CHUNKS,
    "inference": _INFERENCE_CHUNKS,
    "tiles": _TILES_SIDE * _TILES_SIDE,
    "fitness": _FITNESS_CHUNKS,
}


@attrs.frozen
class Pattern:
    """One demo pattern: a CUDA kernel, its inputs, its aggregator and the answer's check."""

    name: str
    kernel: CudaKernel
    inputs: list[bytes]
    aggregator: Callable[[], Aggregator]
    # check(value) -> (matches the direct reference, the answer in words)
    check: Callable[[Any], tuple[bool, str]]


def _outputs(reference: Callable[..., bytes], inputs: list[bytes]) -> list[bytes]:
    return [reference(np, data) for data in inputs]


def _montecarlo() -> Pattern:
    inputs = [montecarlo.encode_seed(_RNG_SEED << 32 | i) for i in range(_MC_CHUNKS)]

    def check(value: Any) -> tuple[bool, str]:
        direct = MeanCI(dtype="uint64", scale=montecarlo.PI_SCALE)
        for i, out in enumerate(_outputs(montecarlo.reference, inputs)):
            direct.add(i, out)
        want = direct.value()
        # Each chunk's counts are exact; only the mean's float sum runs in arrival order.
        ok = (
            want is not None
            and value.count == want.count
            and math.isclose(value.mean, want.mean, rel_tol=1e-12)
        )
        return ok, f"pi ~ {value.mean:.5f} +- {value.half_width:.5f} (95%, {value.count} chunks)"

    return Pattern(
        "montecarlo",
        montecarlo.cuda_kernel(),
        inputs,
        lambda: MeanCI(scale=montecarlo.PI_SCALE),
        check,
    )


def _inference() -> Pattern:
    rng = np.random.default_rng(_RNG_SEED)
    shape = (inference.MAX_ROWS, inference.N_IN)
    inputs = [
        rng.standard_normal(shape).astype(np.float32).tobytes() for _ in range(_INFERENCE_CHUNKS)
    ]

    def check(value: Any) -> tuple[bool, str]:
        want = np.frombuffer(b"".join(_outputs(inference.reference, inputs)), np.float32)
        ok = value.shape == want.shape and np.allclose(
            value, want, rtol=inference.RTOL, atol=inference.ATOL
        )
        classes = np.bincount(value.reshape(-1, inference.N_OUT).argmax(axis=1), minlength=4)
        return (
            ok,
            f"{value.size // inference.N_OUT} rows of logits; argmax classes {classes.tolist()}",
        )

    return Pattern("inference", inference.cuda_kernel(), inputs, lambda: Concat(), check)


def _tiles() -> Pattern:
    side = _TILES_SIDE
    inputs = [tiles.encode_tile(i % side, i // side) for i in range(side * side)]

    def aggregator() -> TileImage:
        return TileImage(grid=(side, side), tile=(tiles.TILE, tiles.TILE))

    def check(value: Any) -> tuple[bool, str]:
        direct = aggregator()
        direct.dtype = "uint32"
        for i, out in enumerate(_outputs(tiles.reference, inputs)):
            direct.add(i, out)
        want = direct.value()
        ok = value is not None and want is not None and np.array_equal(value, want)
        inside = int((value == tiles.MAX_ITER).sum()) if value is not None else 0
        shape = "x".join(map(str, value.shape)) if value is not None else "no"
        return ok, f"{shape} image of escape counts; {inside} pixels in the set"

    return Pattern("tiles", tiles.cuda_kernel(), inputs, aggregator, check)


def _fitness() -> Pattern:
    rng = np.random.default_rng(_RNG_SEED)
    shape = (fitness.MAX_POPULATION, fitness.N_GENES)
    inputs = [
        rng.uniform(-5.12, 5.12, shape).astype(np.float32).tobytes() for _ in range(_FITNESS_CHUNKS)
    ]

    def check(value: Any) -> tuple[bool, str]:
        direct = TopK(_TOP_K, dtype="float32")
        for i, out in enumerate(_outputs(fitness.reference, inputs)):
            direct.add(i, out)
        want = direct.value()
        ok = [i for i, _ in value] == [i for i, _ in want] and np.allclose(
            [v for _, v in value], [v for _, v in want], rtol=fitness.RTOL, atol=fitness.ATOL
        )
        best = ", ".join(f"chunk {i}: {v:.3f}" for i, v in value)
        return ok, f"best {_TOP_K} chunks by their fittest individual: {best}"

    return Pattern("fitness", fitness.cuda_kernel(), inputs, lambda: TopK(_TOP_K), check)


PATTERNS: dict[str, Callable[[], Pattern]] = {
    "montecarlo": _montecarlo,
    "inference": _inference,
    "tiles": _tiles,
    "fitness": _fitness,
}
