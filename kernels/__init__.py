"""Built-in kernels and the registry type; no global registry is mutated at import.

The names are imported on first use (PEP 562): a node agent imports `vramfabric.kernels.code`
or `.registry` without paying for NumPy and the CUDA kernels, which only executors run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cuda import (
        ArgSpec,
        CudaKernel,
        CudaSourceError,
        HostUnsupported,
        ModuleCache,
    )
    from .errors import KernelArgumentError, KernelCompileError, NoReference
    from .host_faults import KernelFault, KernelRace
    from .hyperparam import HYPERPARAM_EVAL
    from .kernel import Kernel
    from .registry import KernelMissing, Registry

    BUILTINS: tuple[Kernel, ...]

# Public name -> the submodule that defines it.
_WHERE = {
    "ArgSpec": "cuda",
    "CudaKernel": "cuda",
    "CudaSourceError": "cuda",
    "HostUnsupported": "cuda",
    "KernelCompileError": "errors",
    "ModuleCache": "cuda",
    "NoReference": "errors",
    "HYPERPARAM_EVAL": "hyperparam",
    "Kernel": "kernel",
    "KernelArgumentError": "errors",
    "KernelFault": "host_faults",
    "KernelRace": "host_faults",
    "KernelMissing": "registry",
    "Registry": "registry",
}


def __getattr__(name: str) -> Any:
    if name == "BUILTINS":
        return (__getattr__("HYPERPARAM_EVAL"),)
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{where}", __name__), name)
    globals()[name] = value  # looked up here from now on
    return value


def builtin_registry() -> Registry:
    """A fresh registry holding the built-in kernels."""
    from .registry import Registry

    return Registry({k.name: k for k in __getattr__("BUILTINS")})


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
    "KernelFault",
    "KernelMissing",
    "KernelRace",
    "ModuleCache",
    "NoReference",
    "Registry",
    "builtin_registry",
]
