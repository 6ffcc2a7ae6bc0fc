"""hyperparam_eval: train a small linear model on a built-in synthetic data set, return the loss.

One chunk is one configuration (learning rate, batch size, dropout) packed as `<fif`; the
output is the float32 validation loss. The data, the step count and the dropout masks are
fixed, so a configuration gives the same loss on every node. Dropout masks come from a fixed
uniform table (not a per-call RNG) so a CUDA port can reproduce them bit for bit.

`cuda_kernel()` is the same computation as CUDA source (hyperparam.cu, with the data set
prepended as float bit patterns), a CudaKernel that GPUs launch and simulated GPUs run on
the host path. It is built on first call: building it compile-checks 600 KB of source.
The registered HYPERPARAM_EVAL runs it on workers; `reference` is its oracle (within a
relative 2e-6: the sums run in another order).
"""

from __future__ import annotations

import functools
import struct
import threading
from collections.abc import Mapping
from importlib import resources
from types import ModuleType
from typing import Any

import numpy as np

from .cuda import CudaKernel
from .kernel import Kernel

_CONFIG = struct.Struct("<fif")
N_FEATURES = 16
N_STEPS = 8
MAX_BATCH = 320
N_TRAIN = N_STEPS * MAX_BATCH
N_VAL = 512
_DATA_SEED = 20261121
# Inputs travel as float32: compare against the float32 value of the limit.
_MAX_LR = float(np.float32(0.05))


_DATASET_LOCK = threading.Lock()


def dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The synthetic regression task: (x_train, y_train, x_val, y_val, dropout_uniforms)."""
    # Executors run a chunk per lease on its own thread: build the data set once, not once
    # per thread that arrives before it is cached.
    with _DATASET_LOCK:
        return _dataset()


@functools.cache
def _dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(_DATA_SEED)
    w_true = rng.standard_normal(N_FEATURES).astype(np.float32)
    x = rng.standard_normal((N_TRAIN + N_VAL, N_FEATURES)).astype(np.float32)
    y = (x @ w_true + 0.1 * rng.standard_normal(N_TRAIN + N_VAL)).astype(np.float32)
    uniforms = rng.random((N_STEPS, N_FEATURES)).astype(np.float32)
    for a in (x, y, uniforms):
        a.setflags(write=False)
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:], uniforms


def encode_config(learning_rate: float, batch_size: int, dropout: float) -> bytes:
    """Pack one configuration as the kernel's input bytes."""
    return _CONFIG.pack(learning_rate, batch_size, dropout)


def decode_config(data: bytes) -> tuple[float, int, float]:
    """Unpack input bytes into (learning_rate, batch_size, dropout), validating ranges."""
    if len(data) != _CONFIG.size:
        raise ValueError(f"input must be {_CONFIG.size} bytes (<fif), got {len(data)}")
    lr, batch, dropout = _CONFIG.unpack(data)
    # Far beyond 0.05 the larger batches overflow to inf: reject rather than return garbage.
    if not 0.0 < lr <= _MAX_LR:
        raise ValueError(f"learning_rate {lr} outside (0, 0.05]")
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch_size {batch} outside 1..{MAX_BATCH}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout {dropout} outside [0, 1)")
    return lr, batch, dropout


def search_space(n: int = 1000) -> list[tuple[float, int, float]]:
    """The demo's grid: config i of the burst recipe (lr, batch size, dropout)."""
    return [
        (0.0001 * (1 + (i % 100) * 0.01), 32 * (1 + i // 100), 0.1 + (i % 10) * 0.05)
        for i in range(n)
    ]


def reference(xp: ModuleType, args: Mapping[str, Any], data: bytes) -> bytes:
    """Run N_STEPS of minibatch SGD with input dropout; return the validation MSE (float32)."""
    lr, batch, dropout = decode_config(data)
    x, y, x_val, y_val, uniforms = (xp.asarray(a) for a in dataset())
    # Inverted dropout on features, one mask per step, scaled so the expectation is unchanged.
    masks = (uniforms >= dropout).astype(xp.float32) / xp.float32(1.0 - dropout)
    w = xp.zeros(N_FEATURES, dtype=xp.float32)
    step = xp.float32(lr)
    for s in range(N_STEPS):
        xb = x[s * batch : (s + 1) * batch]
        residual = xb @ (w * masks[s]) - y[s * batch : (s + 1) * batch]
        w -= step * (xb.T @ residual) * masks[s]
    err = x_val @ w - y_val
    loss = xp.mean(err * err, dtype=xp.float32)
    return np.float32(float(loss)).tobytes()


# One block per configuration; hyperparam.cu's reduction is written for this block size.
CUDA_BLOCK = 128


@functools.cache
def cuda_kernel() -> CudaKernel:
    """hyperparam_eval as a CudaKernel: hyperparam.cu with the data set as device arrays."""
    return CudaKernel(
        name="hyperparam_eval_cuda",
        entry="hyperparam_eval",
        grid=(1,),
        block=(CUDA_BLOCK,),
        args=("in", "out", "in_bytes"),
        max_output_bytes=4,
        max_input_bytes=_CONFIG.size,
        source=_data_source() + _cu_file(),
    )


def _cu_file() -> str:
    return (resources.files(__package__) / "hyperparam.cu").read_text()


def _data_source() -> str:
    x_train, y_train, x_val, y_val, uniforms = dataset()
    arrays = {
        "vf_x": np.concatenate([x_train, x_val]),
        "vf_y": np.concatenate([y_train, y_val]),
        "vf_u": uniforms,
    }
    # Bit patterns, not decimal text: the device reads exactly the reference's float32s.
    return "".join(
        f"__device__ const unsigned {name}[{a.size}] = {{{_hex_words(a)}}};\n"
        for name, a in arrays.items()
    )


def _hex_words(array: np.ndarray) -> str:
    # Big-endian bytes spell each word's value in hex: slicing them is 3x faster than
    # formatting 52,000 ints, which every executor process that runs the kernel pays.
    digits = array.ravel().view(np.uint32).astype(">u4").tobytes().hex()
    words = [digits[i : i + 8] for i in range(0, len(digits), 8)]
    return "0x" + "u,0x".join(words) + "u" if words else ""


HYPERPARAM_EVAL = Kernel(
    name="hyperparam_eval",
    reference=reference,
    max_input_bytes=_CONFIG.size,
    max_output_bytes=4,
    workspace_bytes=(N_TRAIN + N_VAL) * (N_FEATURES + 1) * 4 + N_STEPS * N_FEATURES * 4,
    output_dtype="float32",
    # Workers run hyperparam.cu (its file pins the digest; the data set is the seed's).
    source=_cu_file(),
    entry="hyperparam_eval",
    version="2",
    cuda=cuda_kernel,
    validate=decode_config,
)
