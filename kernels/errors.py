"""The kernels' errors that every kernels module may raise: a bad call, a failed build.

Kept apart from the modules that raise them, which import one another: here they import
nothing, so no module needs another for its errors alone.
"""

from __future__ import annotations


class KernelArgumentError(ValueError):
    """A kernel call's input, args or output broke the kernel's limits (a launch failure)."""


class KernelCompileError(Exception):
    """The kernel did not compile or load; `log` holds the compiler's (or driver's) output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log

    def __reduce__(self) -> tuple[type[KernelCompileError], tuple[str, str]]:
        # Executors may pickle errors across processes: keep the log.
        return (type(self), (str(self), self.log))


class NoReference(Exception):
    """A simulated GPU was asked to run a CudaKernel that has no NumPy reference."""
