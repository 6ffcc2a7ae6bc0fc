"""mlp_forward: batch inference, a 16-32-4 MLP forward pass over a chunk of float32 rows.

One chunk is up to MAX_ROWS rows of N_IN float32 features; the output is N_OUT float32
logits per row, zero-padded to MAX_ROWS rows. The weights come from a seed (a kernel arg):
inference.cu hashes each weight's index, so nothing but the seed travels, and `weights`
computes the same exact values in NumPy. The reference sums in the kernel's order, so on
the host path it agrees bit for bit; a GPU contracts multiply-adds into FMAs, hence the
stated tolerance RTOL/ATOL. `Concat` joins the chunks' rows in chunk order.
"""

from __future__ import annotations

import functools
from importlib import resources
from types import ModuleType

import numpy as np

from .cuda import CudaKernel

N_IN, N_HIDDEN, N_OUT = 16, 32, 4
MAX_ROWS = 512
GRID, BLOCK = 2, 128
WEIGHT_SEED = 16
# Host path: equal. A GPU's FMAs round once per multiply-add instead of twice.
RTOL, ATOL = 1e-5, 1e-6
_N_WEIGHTS = N_HIDDEN * N_IN + N_HIDDEN + N_OUT * N_HIDDEN + N_OUT


def weights(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(w1, b1, w2, b2) as inference.cu derives them from `seed` (lowbias32 of the index)."""
    x = np.uint32(seed) ^ (np.arange(_N_WEIGHTS, dtype=np.uint32) * np.uint32(0x9E3779B9))
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    flat = ((x >> np.uint32(8)).astype(np.float32) / np.float32(2**24) - np.float32(0.5)) * (
        np.float32(0.25)
    )
    w1, rest = np.split(flat, [N_HIDDEN * N_IN])
    b1, rest = np.split(rest, [N_HIDDEN])
    w2, b2 = np.split(rest, [N_OUT * N_HIDDEN])
    return w1.reshape(N_HIDDEN, N_IN), b1, w2.reshape(N_OUT, N_HIDDEN), b2


def reference(xp: ModuleType, data: bytes, seed: int = WEIGHT_SEED) -> bytes:
    """The logits of every whole row of `data`, summed in the kernel's order (float32)."""
    rows = len(data) // (N_IN * 4)
    if rows > MAX_ROWS:
        raise ValueError(f"at most {MAX_ROWS} rows per chunk, got {rows}")
    x = xp.frombuffer(data, dtype=xp.float32, count=rows * N_IN).reshape(rows, N_IN)
    w1, b1, w2, b2 = (xp.asarray(a) for a in weights(seed))
    # One multiply and one add at a time, in the kernel's order: no pairwise or BLAS sums.
    hidden = xp.empty((rows, N_HIDDEN), dtype=xp.float32)
    for j in range(N_HIDDEN):
        acc = xp.full(rows, b1[j], dtype=xp.float32)
        for k in range(N_IN):
            acc = acc + w1[j, k] * x[:, k]
        hidden[:, j] = xp.maximum(acc, xp.float32(0.0))
    logits = xp.empty((rows, N_OUT), dtype=xp.float32)
    for o in range(N_OUT):
        acc = xp.full(rows, b2[o], dtype=xp.float32)
        for j in range(N_HIDDEN):
            acc = acc + w2[o, j] * hidden[:, j]
        logits[:, o] = acc
    return bytes(logits.tobytes())


@functools.cache
def cuda_kernel(seed: int = WEIGHT_SEED) -> CudaKernel:
    """mlp_forward as a CudaKernel (inference.cu) with the weights of `seed`."""
    return CudaKernel(
        name="mlp_forward",
        entry="mlp_forward",
        grid=(GRID,),
        block=(BLOCK,),
        args=("in", "out", ("u32", seed), "in_bytes"),
        max_output_bytes=MAX_ROWS * N_OUT * 4,
        max_input_bytes=MAX_ROWS * N_IN * 4,
        output_dtype="float32",
        source=(resources.files(__package__) / "inference.cu").read_text(),
    )
