"""kernels/: the hyperparam_eval reference on NumPy, Kernel limits, the registry and digests."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import attrs
import numpy as np
import pytest

from vramfabric.kernels import (
    BUILTINS,
    HYPERPARAM_EVAL,
    Kernel,
    KernelArgumentError,
    KernelMissing,
    Registry,
    builtin_registry,
)
from vramfabric.kernels.hyperparam import (
    MAX_BATCH,
    decode_config,
    encode_config,
    reference,
    search_space,
)


def loss(data: bytes) -> float:
    out = HYPERPARAM_EVAL.run(np, {}, data)
    assert len(out) == 4
    return float(np.frombuffer(out, dtype=np.float32)[0])


def test_reference_is_deterministic() -> None:
    # Given one configuration
    data = encode_config(0.001, 64, 0.2)
    # When it runs twice
    first, second = HYPERPARAM_EVAL.run(np, {}, data), HYPERPARAM_EVAL.run(np, {}, data)
    # Then the bytes are identical: four bytes of a finite float32
    assert first == second
    assert len(first) == 4
    assert math.isfinite(float(np.frombuffer(first, np.float32)[0]))
    assert reference(np, {}, data) == first


def test_different_configurations_give_different_losses() -> None:
    losses = {
        loss(encode_config(lr, batch, dropout))
        for lr, batch, dropout in [(0.001, 32, 0.1), (0.01, 32, 0.1), (0.001, 320, 0.5)]
    }
    assert len(losses) == 3


def test_more_training_signal_lowers_the_loss() -> None:
    # A larger learning rate (still stable) must fit the linear task better than a tiny one.
    assert loss(encode_config(0.01, 64, 0.0)) < loss(encode_config(1e-6, 64, 0.0))


def test_every_search_space_config_runs_to_a_finite_loss() -> None:
    losses = [loss(encode_config(*config)) for config in search_space(1000)]
    assert all(math.isfinite(x) and x > 0 for x in losses)


def test_search_space_matches_the_recipe() -> None:
    space = search_space(1000)
    assert len(space) == 1000
    for i, (lr, batch, dropout) in enumerate(space):
        assert lr == pytest.approx(0.0001 * (1 + (i % 100) * 0.01))
        assert batch == 32 * (1 + i // 100)
        assert dropout == pytest.approx(0.1 + (i % 10) * 0.05)
    assert space[0] == pytest.approx((0.0001, 32, 0.1))
    assert space[999] == pytest.approx((0.0001 * 1.99, 320, 0.55))
    assert max(batch for _, batch, _ in space) == MAX_BATCH


def test_search_space_prefix_is_stable() -> None:
    assert search_space(10) == search_space(1000)[:10]
    assert search_space(0) == []


def test_config_round_trips_through_float32() -> None:
    lr, batch, dropout = decode_config(encode_config(0.00123, 96, 0.35))
    assert lr == pytest.approx(0.00123, rel=1e-6)
    assert batch == 96
    assert dropout == pytest.approx(0.35, rel=1e-6)


@pytest.mark.parametrize("data", [b"", b"\x00" * 11], ids=["empty", "short"])
def test_run_rejects_short_inputs(data: bytes) -> None:
    with pytest.raises(KernelArgumentError, match=r"hyperparam_eval: input must be 12 bytes"):
        HYPERPARAM_EVAL.run(np, {}, data)


def test_run_rejects_inputs_over_max_input_bytes() -> None:
    with pytest.raises(KernelArgumentError, match="exceeds max_input_bytes=12"):
        HYPERPARAM_EVAL.run(np, {}, encode_config(0.001, 32, 0.1) + b"\x00")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ((0.0, 32, 0.1), "learning_rate"),
        ((-0.1, 32, 0.1), "learning_rate"),
        ((1.5, 32, 0.1), "learning_rate"),
        ((float("nan"), 32, 0.1), "learning_rate"),
        ((0.001, 0, 0.1), "batch_size"),
        ((0.001, -5, 0.1), "batch_size"),
        ((0.001, MAX_BATCH + 1, 0.1), "batch_size"),
        ((0.001, 32, 1.0), "dropout"),
        ((0.001, 32, -0.1), "dropout"),
        ((0.001, 32, float("nan")), "dropout"),
    ],
)
def test_run_rejects_out_of_range_configs(config: tuple[float, int, float], message: str) -> None:
    with pytest.raises(KernelArgumentError, match=f"hyperparam_eval: {message}"):
        HYPERPARAM_EVAL.run(np, {}, encode_config(*config))


def test_kernel_argument_error_is_a_value_error() -> None:
    assert issubclass(KernelArgumentError, ValueError)


def _echo(xp: ModuleType, args: Mapping[str, Any], data: bytes) -> bytes:
    return data * int(args.get("times", 1))


ECHO = Kernel(
    name="echo", reference=_echo, max_input_bytes=8, max_output_bytes=8, workspace_bytes=100
)


def test_run_rejects_outputs_over_max_output_bytes() -> None:
    assert ECHO.run(np, {"times": 2}, b"abcd") == b"abcdabcd"
    with pytest.raises(KernelArgumentError, match="output of 12 bytes exceeds max_output_bytes=8"):
        ECHO.run(np, {"times": 3}, b"abcd")


def test_vram_bytes_is_input_plus_output_plus_workspace() -> None:
    assert ECHO.vram_bytes(8) == 8 + 8 + 100
    assert HYPERPARAM_EVAL.vram_bytes(12) == 12 + 4 + HYPERPARAM_EVAL.workspace_bytes


def test_builtin_registry_holds_the_builtins() -> None:
    registry = builtin_registry()
    assert set(registry) == {k.name for k in BUILTINS} == {"hyperparam_eval"}
    assert registry["hyperparam_eval"] is HYPERPARAM_EVAL
    assert len(registry) == 1


def test_builtin_registry_is_fresh_each_time() -> None:
    first = builtin_registry()
    first.with_kernels([ECHO])
    assert "echo" not in builtin_registry()
    assert builtin_registry() is not first


def test_get_kernel_by_name_and_digest() -> None:
    registry = builtin_registry()
    assert registry.get_kernel("hyperparam_eval") is HYPERPARAM_EVAL
    assert registry.get_kernel("hyperparam_eval", HYPERPARAM_EVAL.digest) is HYPERPARAM_EVAL


def test_get_kernel_with_unknown_name_raises_kernel_missing() -> None:
    with pytest.raises(KernelMissing, match=r"unknown kernel 'nope'.*hyperparam_eval"):
        builtin_registry().get_kernel("nope")


def test_get_kernel_with_another_digest_raises_kernel_missing() -> None:
    newer = attrs.evolve(HYPERPARAM_EVAL, version="9")
    with pytest.raises(KernelMissing, match="not registered"):
        builtin_registry().get_kernel("hyperparam_eval", newer.digest)


def test_kernel_missing_is_a_key_error() -> None:
    assert issubclass(KernelMissing, KeyError)
    with pytest.raises(KeyError):
        builtin_registry()["nope"]


def test_with_kernels_returns_a_new_registry() -> None:
    # Given the builtin registry
    base = builtin_registry()
    # When a kernel is added
    extended = base.with_kernels([ECHO])
    # Then the copy has both and the original is unchanged
    assert isinstance(extended, Registry)
    assert extended is not base
    assert set(extended) == {"hyperparam_eval", "echo"}
    assert set(base) == {"hyperparam_eval"}


def test_with_kernels_replaces_a_same_named_kernel() -> None:
    newer = attrs.evolve(HYPERPARAM_EVAL, version="9")
    registry = builtin_registry().with_kernels([newer])
    assert registry.get_kernel("hyperparam_eval") is newer
    assert len(registry) == 1
    with pytest.raises(KernelMissing):
        registry.get_kernel("hyperparam_eval", HYPERPARAM_EVAL.digest)


def test_empty_registry() -> None:
    assert len(Registry()) == 0
    with pytest.raises(KernelMissing):
        Registry().get_kernel("hyperparam_eval")


def test_digest_is_a_stable_sha256_hex() -> None:
    digest = HYPERPARAM_EVAL.digest
    assert len(digest) == 64
    int(digest, 16)
    assert attrs.evolve(HYPERPARAM_EVAL).digest == digest


@pytest.mark.parametrize(
    "change",
    [{"version": "9"}, {"name": "other"}, {"source": "__global__ void k(){}"}, {"entry": "k"}],
    ids=lambda c: next(iter(c)),
)
def test_digest_changes_with_version_name_source_and_entry(change: dict[str, Any]) -> None:
    assert attrs.evolve(HYPERPARAM_EVAL, **change).digest != HYPERPARAM_EVAL.digest


def test_digest_parts_are_separated() -> None:
    # "ab" + "c" must not hash like "a" + "bc"
    a = Kernel(name="ab", reference=_echo, max_input_bytes=1, max_output_bytes=1, version="c")
    b = Kernel(name="a", reference=_echo, max_input_bytes=1, max_output_bytes=1, version="bc")
    assert a.digest != b.digest
