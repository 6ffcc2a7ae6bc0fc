"""Private files stay private, and kernel modules may list their kernels lazily."""

from __future__ import annotations

import stat
import sys
import types
from pathlib import Path

import pytest

from tests import kernels_for_tests
from vramfabric.broker import auth
from vramfabric.kernels import builtin_registry
from vramfabric.kernels.registry import load_registry


def test_a_private_file_that_existed_world_readable_ends_owner_only(tmp_path: Path) -> None:
    # Given a file left world-readable by something else
    path = tmp_path / "server.json"
    path.write_text("old")
    path.chmod(0o644)
    # When a config with passwords is written over it
    auth.write_private(path, '{"password": "s3cret"}')
    # Then only its owner can read it, and it holds the new text alone
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == '{"password": "s3cret"}'


def test_a_module_whose_kernels_are_a_generator_registers_them_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a kernel module that lists its kernels as a generator
    module = types.ModuleType("lazy_kernels")
    module.KERNELS = (k for k in kernels_for_tests.KERNELS)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lazy_kernels", module)
    # When it is loaded
    registry = load_registry(builtin_registry(), ["lazy_kernels"])
    # Then each of its kernels is there, not an empty generator's none
    for kernel in kernels_for_tests.KERNELS:
        assert registry.get(kernel.name) is kernel
