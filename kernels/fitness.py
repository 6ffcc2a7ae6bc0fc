"""rastrigin_fitness: genetic-algorithm fitness, the Rastrigin function of a population chunk.

One chunk is up to MAX_POPULATION individuals of N_GENES float32 genes (in [-5.12, 5.12],
the function's usual domain); the output is float32: the chunk's best (smallest) fitness,
then each individual's, zero-padded. Rastrigin's minimum is 0 at the origin. The sum runs in
double and is rounded to float32 once, so the CUDA source and the `reference` differ only by
their cosines' last bits and the GPU's FMAs: RTOL/ATOL below. `TopK` ranks the chunks.
"""

from __future__ import annotations

import functools
from importlib import resources
from types import ModuleType

import numpy as np

from .cuda import CudaKernel

N_GENES = 16
MAX_POPULATION = 256
# Measured on the host path: equal at float32; the margin covers a GPU's cos and FMAs.
RTOL, ATOL = 1e-6, 1e-5


def reference(xp: ModuleType, data: bytes) -> bytes:
    """The chunk's best fitness, then each individual's (float32), as rastrigin_fitness."""
    n = len(data) // (N_GENES * 4)
    if n > MAX_POPULATION:
        raise ValueError(f"at most {MAX_POPULATION} individuals per chunk, got {n}")
    genes = xp.frombuffer(data, dtype=xp.float32, count=n * N_GENES).reshape(n, N_GENES)
    total = xp.full(n, 10.0 * N_GENES)
    # Gene by gene, as the kernel adds them (a pairwise sum would round differently).
    for g in range(N_GENES):
        x = genes[:, g].astype(xp.float64)
        total = total + (x * x - 10.0 * xp.cos(2.0 * np.pi * x))
    fitness = total.astype(xp.float32)
    best = fitness.min() if n else xp.float32(np.inf)
    return bytes(xp.concatenate([xp.asarray([best], dtype=xp.float32), fitness]).tobytes())


@functools.cache
def cuda_kernel() -> CudaKernel:
    """rastrigin_fitness as a CudaKernel (fitness.cu)."""
    return CudaKernel(
        name="rastrigin_fitness",
        entry="rastrigin_fitness",
        grid=(1,),
        block=(MAX_POPULATION,),
        args=("in", "out", "in_bytes"),
        max_output_bytes=(1 + MAX_POPULATION) * 4,
        max_input_bytes=MAX_POPULATION * N_GENES * 4,
        output_dtype="float32",
        source=(resources.files(__package__) / "fitness.cu").read_text(),
    )
