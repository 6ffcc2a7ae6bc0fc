"""mandelbrot_tile: image tiles, the escape counts of one 32 x 32 tile of the Mandelbrot set.

One chunk is a tile's (column, row) packed as `<II`; the output is TILE * TILE uint32
counts, row-major. The view (top-left corner, pixel step) and the iteration cap are kernel
args, the same for every tile. The kernel rounds every double operation on its own, as
NumPy does, so the counts of tiles.cu (host path or GPU) equal the `reference`'s exactly.
`TileImage` assembles the tiles into the image.
"""

from __future__ import annotations

import functools
import struct
from importlib import resources
from types import ModuleType

from .cuda import CudaKernel

TILE = 32
_TILE_XY = struct.Struct("<II")
# The demo's view: the whole set in a square image of 8 x 8 tiles (256 x 256 pixels).
X0, Y0, STEP = -2.0, -1.25, 2.5 / 256
MAX_ITER = 256


def encode_tile(column: int, row: int) -> bytes:
    """Pack a tile's position as the kernel's input bytes."""
    return _TILE_XY.pack(column, row)


def reference(
    xp: ModuleType,
    data: bytes,
    view: tuple[float, float, float] = (X0, Y0, STEP),
    max_iter: int = MAX_ITER,
) -> bytes:
    """The tile's escape counts (uint32, row-major), as mandelbrot_tile computes them."""
    if len(data) != _TILE_XY.size:
        raise ValueError(f"input must be {_TILE_XY.size} bytes (<II), got {len(data)}")
    column, row = _TILE_XY.unpack(data)
    x0, y0, step = view
    py, px = xp.mgrid[0:TILE, 0:TILE].astype(xp.float64)
    cr = x0 + (column * TILE + px) * step
    ci = y0 + (row * TILE + py) * step
    zr, zi = xp.zeros_like(cr), xp.zeros_like(ci)
    counts = xp.zeros((TILE, TILE), dtype=xp.uint32)
    active = xp.ones((TILE, TILE), dtype=bool)
    for _ in range(max_iter):
        zr2, zi2 = zr * zr, zi * zi
        active &= ~(zr2 + zi2 > 4.0)
        if not active.any():
            break
        # Escaped pixels keep their z (as the kernel's threads stop), so nothing overflows.
        zi = xp.where(active, 2.0 * zr * zi + ci, zi)
        zr = xp.where(active, zr2 - zi2 + cr, zr)
        counts += active
    return bytes(counts.tobytes())


@functools.cache
def cuda_kernel(
    view: tuple[float, float, float] = (X0, Y0, STEP), max_iter: int = MAX_ITER
) -> CudaKernel:
    """mandelbrot_tile as a CudaKernel (tiles.cu) over `view` = (x0, y0, step)."""
    x0, y0, step = view
    return CudaKernel(
        name="mandelbrot_tile",
        entry="mandelbrot_tile",
        grid=(1,),
        block=(TILE, TILE),
        args=("in", "out", ("f64", x0), ("f64", y0), ("f64", step), ("u32", max_iter), "in_bytes"),
        max_output_bytes=TILE * TILE * 4,
        max_input_bytes=_TILE_XY.size,
        output_dtype="uint32",
        source=(resources.files(__package__) / "tiles.cu").read_text(),
    )
