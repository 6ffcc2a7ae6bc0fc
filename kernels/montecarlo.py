"""montecarlo_pi: a Monte Carlo estimate of pi with per-chunk counter-based seeds (Philox).

One chunk is one 64-bit seed (`<Q`); the output is two uint64s, the points inside the
quarter circle and the points drawn. Philox4x32-10 is counter-based: point (thread, draw)
of a seed needs no state from any other point, so the CUDA source (montecarlo.cu), run on a
GPU or on the host path, and the NumPy `reference` give the same counts, bit for bit. The
chunk's estimate of pi is 4 * hits / points; `MeanCI(scale=PI_SCALE)` averages them.
"""

from __future__ import annotations

import functools
import struct
from importlib import resources
from types import ModuleType

import numpy as np

from .cuda import CudaKernel

_SEED = struct.Struct("<Q")
# Launch shape and draws per thread, as montecarlo.cu defines them.
GRID = 4
BLOCK = 128
DRAWS = 64
POINTS = GRID * BLOCK * DRAWS * 2
PI_SCALE = 4.0 / POINTS
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_LOW32 = np.uint64(0xFFFFFFFF)


def encode_seed(seed: int) -> bytes:
    """Pack one chunk's seed as the kernel's input bytes."""
    return _SEED.pack(seed)


def philox4x32_10(
    counter: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], key: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Philox4x32-10 (Salmon et al. 2011) over uint32 counter arrays; four uint32 words out."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = key
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        p0, p1 = _M0 * c0, _M1 * c2  # 32 x 32 bits: exact in uint64
        c0, c1, c2, c3 = (
            (p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0),
            p1 & _LOW32,
            (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1),
            p0 & _LOW32,
        )
    return c0, c1, c2, c3


def reference(xp: ModuleType, data: bytes) -> bytes:
    """The counts montecarlo.cu gives for this seed: `<QQ` hits, points (NumPy only)."""
    if len(data) != _SEED.size:
        raise ValueError(f"input must be {_SEED.size} bytes (<Q), got {len(data)}")
    (seed,) = _SEED.unpack(data)
    draw, thread = np.meshgrid(
        np.arange(DRAWS, dtype=np.uint64), np.arange(GRID * BLOCK, dtype=np.uint64)
    )
    zero = np.zeros_like(draw)
    words = philox4x32_10((draw, thread, zero, zero), (seed & 0xFFFFFFFF, seed >> 32))
    x = np.concatenate([words[0], words[2]]) >> np.uint64(8)
    y = np.concatenate([words[1], words[3]]) >> np.uint64(8)
    hits = int(np.count_nonzero(x * x + y * y < np.uint64(1 << 48)))
    return np.array([hits, POINTS], dtype=np.uint64).tobytes()


@functools.cache
def cuda_kernel() -> CudaKernel:
    """montecarlo_pi as a CudaKernel (montecarlo.cu); the output is uint64 hits, points."""
    return CudaKernel(
        name="montecarlo_pi",
        entry="montecarlo_pi",
        grid=(GRID,),
        block=(BLOCK,),
        args=("in", "out", "in_bytes"),
        max_output_bytes=16,
        max_input_bytes=_SEED.size,
        output_dtype="uint64",
        source=(resources.files(__package__) / "montecarlo.cu").read_text(),
    )
