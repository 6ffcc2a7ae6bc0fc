"""Built-in kernels and the registry type; no global registry is mutated at import."""

from .cuda import (
    ArgSpec,
    CudaKernel,
    CudaSourceError,
    HostUnsupported,
    KernelCompileError,
    ModuleCache,
    NoReference,
)
from .hyperparam import HYPERPARAM_EVAL
from .kernel import Kernel, KernelArgumentError
from .registry import KernelMissing, Registry

BUILTINS: tuple[Kernel, ...] = (HYPERPARAM_EVAL,)


def builtin_registry() -> Registry:
    """A fresh registry holding the built-in kernels."""
    return Registry({k.name: k for k in BUILTINS})


__all__ = [
    "BUILTINS",
    "HYPERPARAM_EVAL",
    "ArgSpec",
    "CudaKernel",
    "CudaSourceError",
    "HostUnsupported",
    "Kernel",
    "KernelArgumentError",
    "KernelCompileError",
    "KernelMissing",
    "ModuleCache",
    "NoReference",
    "Registry",
    "builtin_registry",
]
