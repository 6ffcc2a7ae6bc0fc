"""Check mode: one chunk run as a GPU's sanitizer would, on the CPU, before it is trusted.

The chunk runs twice on the kernel's check build (host_build.py, `check=True`): once with
blocks and threads in order and one poison pattern in shared memory, once in reverse order
with another. The check build reports races, reads of shared memory before any write and
out-of-bounds accesses as they happen (cuda_host_check.h); the two runs must then give the
same bytes. If they do not, a third run (in order, the second poison) tells a dependence on
memory the kernel never wrote from a dependence on the order its threads and blocks run
in: a race it could not see (through a global, or from block to block). Float atomics
that only change the last bits in another order are allowed, as on a GPU.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from .host import CHECK, POISON_B, QUIET, REVERSE, launcher, run_host
from .host_faults import KernelFault, KernelRace
from .settings import CudaSettings

if TYPE_CHECKING:
    from .cuda_shape import CudaShape

log = logging.getLogger(__name__)

# Float outputs that differ by at most this (relative to the largest magnitude of the output)
# between schedules of a kernel with atomics are the rounding of atomics in another order.
ATOMIC_RTOL = 1e-5


def check_chunk(kernel: CudaShape, data: bytes, settings: CudaSettings | None = None) -> bytes:
    """Run `data` through the kernel in check mode; its output, if nothing is wrong.

    Raises:
        KernelFault: a race, a read of unwritten shared memory, a bad access, a broken
            barrier or warp rule, or an output that depends on memory never written.
        KernelRace: the output depends on the order blocks and threads run in.
        KernelCompileError: the check build failed.
    """
    library = launcher(kernel, settings, check=True)
    first = run_host(kernel, data, library, CHECK)
    second = run_host(kernel, data, library, CHECK | REVERSE | POISON_B | QUIET)
    if first == second:
        return first
    third = run_host(kernel, data, library, CHECK | POISON_B | QUIET)
    if third != first:
        at = _first_difference(first, third)
        raise KernelFault(
            f"kernel {kernel.name}: its output depends on memory it never wrote: byte {at} of "
            f"`out` is 0x{first[at]:02x} with one poison pattern in shared memory and "
            f"0x{third[at]:02x} with another (an uninitialised __shared__ or local variable)"
        )
    if _atomic_rounding(kernel, first, second):
        log.info("kernel %s: float atomics in another order changed the last bits", kernel.name)
        return first
    at = _first_difference(first, second)
    raise KernelRace(
        f"kernel {kernel.name}: race: its output differs when its blocks and threads run in "
        f"another order (byte {at} of `out`: 0x{first[at]:02x} in order, 0x{second[at]:02x} in "
        "reverse order); threads that share data need __syncthreads, atomics, or a kernel "
        "boundary between them"
    )


def _first_difference(a: bytes, b: bytes) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)


def _atomic_rounding(kernel: CudaShape, a: bytes, b: bytes) -> bool:
    dtype = np.dtype(kernel.output_dtype)
    if dtype.kind != "f" or "atomic" not in kernel.source:
        return False
    x, y = np.frombuffer(a, dtype).astype(np.float64), np.frombuffer(b, dtype).astype(np.float64)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return False
    scale = max(float(np.abs(x).max()), float(np.abs(y).max()), np.finfo(dtype).tiny)
    return bool(np.abs(x - y).max() <= ATOMIC_RTOL * scale)
