"""Kernel: a named stateless computation, bytes in and bytes out, with a NumPy/CuPy reference."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import attrs

from .errors import KernelArgumentError

if TYPE_CHECKING:
    from .cuda import CudaKernel

# reference(xp, args, data) -> output bytes; `xp` is numpy or cupy.
Reference = Callable[[ModuleType, Mapping[str, Any], bytes], bytes]


@attrs.frozen
class Kernel:
    """A kernel as workers run it.

    Args:
        name: registry key, also the `kernel` field of a JobSpec.
        reference: the array-module implementation (NumPy on a simulated GPU).
        max_input_bytes / max_output_bytes: hard limits checked on every call.
        workspace_bytes: device memory a call needs beside its input and output; a
            slice smaller than the sum cannot run it.
        source / entry: the CUDA source file and entry point of its CUDA version (hashed
            into the digest; empty when it has none).
        version: bump when the reference's numbers change, so the digest changes.
        cuda: builds the CUDA version (a CudaKernel, built once per process): workers run
            it, launched on a GPU and on the host path of a simulated one, and the
            reference becomes its oracle. None: the reference runs everywhere.
        validate: raises ValueError for an input the kernel refuses (the reference's
            checks), run before the CUDA version, which has no way to say why.
    """

    name: str
    reference: Reference
    max_input_bytes: int
    max_output_bytes: int
    workspace_bytes: int = 0
    output_dtype: str = "float32"
    source: str = ""
    entry: str = ""
    version: str = "1"
    cuda: Callable[[], CudaKernel] | None = attrs.field(default=None, eq=False, repr=False)
    validate: Callable[[bytes], object] | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def digest(self) -> str:
        """sha256 over name, version, source and entry: what a JobSpec pins.

        The reference's code is not hashed: bump `version` when its numbers change.
        """
        h = hashlib.sha256()
        for part in (self.name, self.version, self.source, self.entry):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def vram_bytes(self, input_bytes: int) -> int:
        """Device memory one call with an input of `input_bytes` needs."""
        return input_bytes + self.max_output_bytes + self.workspace_bytes

    def run(self, xp: ModuleType, args: Mapping[str, Any], data: bytes) -> bytes:
        """Run the reference on `data`, enforcing the size limits.

        Raises:
            KernelArgumentError: the input or output breaks a limit, or the reference
                rejected its arguments with a ValueError.
        """
        self.check_input(data)
        try:
            out = self.reference(xp, args, data)
        except ValueError as exc:
            raise KernelArgumentError(f"{self.name}: {exc}") from None
        if len(out) > self.max_output_bytes:
            raise KernelArgumentError(
                f"{self.name}: output of {len(out)} bytes exceeds "
                f"max_output_bytes={self.max_output_bytes}"
            )
        return out

    def check_input(self, data: bytes) -> None:
        """Check `data` against `max_input_bytes` and `validate`.

        Raises:
            KernelArgumentError: it is too large, or `validate` refused it.
        """
        if len(data) > self.max_input_bytes:
            raise KernelArgumentError(
                f"{self.name}: input of {len(data)} bytes exceeds "
                f"max_input_bytes={self.max_input_bytes}"
            )
        if self.validate is not None:
            try:
                self.validate(data)
            except ValueError as exc:
                raise KernelArgumentError(f"{self.name}: {exc}") from None
