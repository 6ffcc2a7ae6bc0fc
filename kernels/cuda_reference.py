"""A CudaKernel's NumPy reference as its blob carries it: pickled by value, loaded lazily.

Unpickling runs the sender's code, so it happens on the first call, never when a blob is
parsed: only workers that allow code (and run the sender's Python) ever do it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TypeAlias

import attrs
import cloudpickle

from .code import python_version
from .errors import KernelArgumentError, KernelCompileError

# reference(xp, data) -> output bytes; `xp` is numpy on a simulated GPU.
Reference: TypeAlias = Callable[[ModuleType, bytes], bytes]


@attrs.frozen
class PickledReference:
    """A reference as the blob carries it: unpickled on its first call, never in `from_blob`."""

    pickled: bytes = attrs.field(repr=False)
    python: str
    _loaded: list[Reference] = attrs.field(init=False, factory=list, eq=False, repr=False)

    def __call__(self, xp: ModuleType, data: bytes) -> bytes:
        """Unpickle (once) and call the reference."""
        return self.load("reference")(xp, data)

    def load(self, name: str) -> Reference:
        """The unpickled function (this runs the sender's code).

        Raises:
            KernelArgumentError: it was pickled on another Python version.
            KernelCompileError: it did not unpickle (a module missing on this worker, say).
        """
        if not self._loaded:
            here = python_version()
            if self.python != here:
                raise KernelArgumentError(
                    f"{name}: the reference was pickled on Python {self.python}; "
                    f"this worker runs Python {here}"
                )
            try:
                fn = cloudpickle.loads(self.pickled)
            except Exception as exc:  # unpickling runs arbitrary code: any error is "not loaded"
                raise KernelCompileError(
                    f"{name}: the reference did not unpickle", f"{type(exc).__name__}: {exc}"
                ) from None
            if not callable(fn):
                raise KernelCompileError(f"{name}: the reference is a {type(fn).__name__}")
            # Two threads may both unpickle the first time; either result is the same function.
            self._loaded.append(fn)
        return self._loaded[0]
