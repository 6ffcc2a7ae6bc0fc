"""Registry: the kernels a node can run, looked up by name (and pinned by digest)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping

import attrs

from .kernel import Kernel


class KernelMissing(KeyError):
    """No kernel of that name, or of that digest, is registered."""


def _as_dict(kernels: Mapping[str, Kernel]) -> dict[str, Kernel]:
    # A typed `dict`: mypy's attrs plugin cannot type `converter=dict` (it is overloaded).
    return dict(kernels)


@attrs.frozen
class Registry(Mapping[str, Kernel]):
    """An immutable name -> Kernel map; `with_kernels` returns an extended copy."""

    _kernels: Mapping[str, Kernel] = attrs.field(factory=dict, converter=_as_dict)

    def __getitem__(self, name: str) -> Kernel:
        return self._kernels[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kernels)

    def __len__(self) -> int:
        return len(self._kernels)

    def get_kernel(self, name: str, digest: str = "") -> Kernel:
        """The kernel `name`; if `digest` is given it must match the registered version.

        Raises:
            KernelMissing: no such name, or this registry has another version of it.
        """
        kernel = self._kernels.get(name)
        if kernel is None:
            raise KernelMissing(f"unknown kernel {name!r}; registered: {sorted(self._kernels)}")
        if digest and digest != kernel.digest:
            raise KernelMissing(
                f"kernel {name!r} version {digest[:12]} not registered (have {kernel.digest[:12]})"
            )
        return kernel

    def with_kernels(self, kernels: Iterable[Kernel]) -> Registry:
        """A copy with `kernels` added (a same-named kernel is replaced)."""
        merged = dict(self._kernels)
        merged.update((k.name, k) for k in kernels)
        return Registry(merged)


# The built-ins' names, known without importing them (NumPy and 600 KB of CUDA source): a
# node agent advertises the kernels it has but never runs one. tests/unit/test_placement_kernels.py
# holds this to builtin_registry().
BUILTIN_NAMES = ("hyperparam_eval",)


def module_kernels(name: str) -> tuple[Kernel, ...]:
    """The `KERNELS` of module `name`, imported.

    Raises:
        ValueError: the module has no `KERNELS` iterable of Kernel.
        ImportError: the module does not import.
    """
    found = getattr(importlib.import_module(name), "KERNELS", None)
    # A tuple first: checking a generator would use it up before it is registered.
    kernels = tuple(found) if isinstance(found, Iterable) else None
    if kernels is None or not all(isinstance(k, Kernel) for k in kernels):
        raise ValueError(f"module {name!r} has no KERNELS iterable of Kernel")
    return kernels


def load_registry(base: Registry, modules: Iterable[str]) -> Registry:
    """`base` plus the `KERNELS` iterable of each module, imported by name.

    Raises:
        ValueError: a module has no `KERNELS` iterable of Kernel.
        ImportError: a module does not import.
    """
    registry = base
    for name in modules:
        registry = registry.with_kernels(module_kernels(name))
    return registry


def kernel_names(modules: Iterable[str]) -> tuple[str, ...]:
    """The names a registry of the built-ins plus `modules` holds, sorted (what a node advertises).

    The modules are imported (a worker started with them has imported them already); the
    built-ins are not.

    Raises:
        ValueError, ImportError: as load_registry.
    """
    names = set(BUILTIN_NAMES)
    for name in modules:
        names.update(k.name for k in module_kernels(name))
    return tuple(sorted(names))
