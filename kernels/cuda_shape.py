"""CudaShape: the fields of a CudaKernel that its checks, compiler and host path read.

cuda.py builds CudaKernel from those modules; they take a CudaShape, so none of them
imports cuda.py back (no import circle), and mypy checks CudaKernel against it.
"""

from __future__ import annotations

from typing import Protocol, TypeAlias

# "in" | "out" | "in_bytes" | (scalar type, value), e.g. ("f32", 2.0).
ArgSpec: TypeAlias = str | tuple[str, int | float]


class CudaShape(Protocol):
    """A CUDA kernel as its helpers see it: read-only fields (CudaKernel is frozen)."""

    @property
    def name(self) -> str:
        """The kernel's name, in every error about it."""

    @property
    def entry(self) -> str:
        """The entry point's name in the source or PTX."""

    @property
    def grid(self) -> tuple[int, int, int]:
        """Blocks per grid, padded to 3 dims."""

    @property
    def block(self) -> tuple[int, int, int]:
        """Threads per block, padded to 3 dims."""

    @property
    def args(self) -> tuple[ArgSpec, ...]:
        """The launch arguments, in order."""

    @property
    def max_input_bytes(self) -> int:
        """The largest chunk it takes."""

    @property
    def max_output_bytes(self) -> int:
        """The size of its `out` buffer, returned whole."""

    @property
    def source(self) -> str:
        """CUDA C++ source, or '' for a PTX kernel."""

    @property
    def ptx(self) -> str:
        """PTX, or '' for a source kernel."""

    @property
    def output_dtype(self) -> str:
        """The NumPy dtype its output is read as."""

    @property
    def shared_mem_bytes(self) -> int:
        """Dynamic shared memory per block."""

    @property
    def reference(self) -> object:
        """Its NumPy reference (callable), or None."""

    @property
    def digest(self) -> str:
        """sha256 of its blob."""
