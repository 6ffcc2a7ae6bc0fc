"""GPU discovery: NVML when pynvml finds GPUs, or a simulated fleet such as `4x48GiB`."""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import attrs

from vramfabric.broker.messages import SIMULATED_MODEL
from vramfabric.broker.settings import parse_size

from .settings import WorkerSettings

log = logging.getLogger(__name__)

_SIMULATE = re.compile(r"^\s*(\d+)\s*[xX]\s*(.+)$")


@attrs.frozen
class GpuSpec:
    """A GPU as the worker found it: index, model, total VRAM, and whether it is real.

    `uuid` pins the device for its executors (`CUDA_VISIBLE_DEVICES`), and `cpus` are the
    cores local to its NUMA node, which its executors are bound to (empty: no binding).
    """

    index: int
    model: str
    total_bytes: int
    simulated: bool = True
    uuid: str = ""
    cpus: tuple[int, ...] = ()


def parse_simulate(spec: str) -> tuple[GpuSpec, ...]:
    """Parse `COUNTxSIZE` (e.g. `4x48GiB`) into that many simulated GPUs."""
    match = _SIMULATE.match(spec)
    if not match:
        raise ValueError(f"not a simulate spec: {spec!r} (expected COUNTxSIZE, e.g. 4x48GiB)")
    count, size = int(match.group(1)), parse_size(match.group(2))
    if not 1 <= count <= 64:
        raise ValueError(f"simulated GPU count must be 1..64, got {count}")
    return tuple(GpuSpec(i, SIMULATED_MODEL, size, simulated=True) for i in range(count))


def check_slice(gpus: tuple[GpuSpec, ...], slice_bytes: int) -> None:
    """ValueError unless a slice of `slice_bytes` fits on one of `gpus` at least."""
    largest = max(gpu.total_bytes for gpu in gpus)
    if slice_bytes > largest:
        raise ValueError(
            f"a slice of {_size_text(slice_bytes)} is larger than every GPU here (the largest "
            f"has {_size_text(largest)}): this node could lease nothing; give a smaller --slice"
        )


def _size_text(n_bytes: int) -> str:
    """`n_bytes` in the largest binary unit that divides it (as flags are written)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes % size == 0:
            return f"{n_bytes // size}{unit}"
    return f"{n_bytes} bytes"


def open_nvml() -> Any | None:
    """The initialised pynvml module, or None when pynvml or a driver is missing.

    Every successful call must be paired with `nvml.nvmlShutdown()` (NVML counts them).
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # no driver, no device, a driver/library mismatch
        log.info("nvml unavailable error=%s", exc)
        return None
    return pynvml


def discover_nvml(nvml: Any | None = None) -> tuple[GpuSpec, ...]:
    """The node's real GPUs through NVML; empty when pynvml or a driver is missing.

    `nvml` is an initialised pynvml-like module (tests pass a recorded fake); by default
    pynvml is opened and shut down again here.
    """
    owned = nvml is None
    nvml = open_nvml() if owned else nvml
    if nvml is None:
        return ()
    try:
        return tuple(_spec(nvml, i) for i in range(nvml.nvmlDeviceGetCount()))
    finally:
        if owned:
            nvml.nvmlShutdown()


def discover(settings: WorkerSettings) -> tuple[GpuSpec, ...]:
    """The node's GPUs: simulated when asked, else NVML.

    Raises:
        ValueError: there are none, or none that holds a slice.
    """
    gpus = parse_simulate(settings.simulate) if settings.simulate else discover_nvml()
    if not gpus:
        raise ValueError("no GPU found through NVML; run with --simulate COUNTxSIZE (e.g. 4x48GiB)")
    check_slice(gpus, settings.slice_bytes)
    return gpus


def text(value: str | bytes) -> str:
    """An NVML string: older pynvml releases return bytes."""
    return value if isinstance(value, str) else value.decode()


def _spec(nvml: Any, index: int) -> GpuSpec:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    return GpuSpec(
        index,
        text(nvml.nvmlDeviceGetName(handle)),
        int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        simulated=False,
        uuid=text(nvml.nvmlDeviceGetUUID(handle)),
        cpus=local_cpus(nvml, handle),
    )


def local_cpus(nvml: Any, handle: Any) -> tuple[int, ...]:
    """The cores NVML calls close to the GPU, within this process's allowed set.

    Empty when NVML cannot say (NVMLError_NotSupported on some boards and in containers):
    an executor then runs unpinned.
    """
    allowed = os.sched_getaffinity(0)
    words = (max(allowed) // 64) + 1
    try:
        masks = nvml.nvmlDeviceGetCpuAffinity(handle, words)
    except nvml.NVMLError as exc:
        log.info("no cpu affinity from nvml error=%s", exc)
        return ()
    cpus = {w * 64 + b for w, mask in enumerate(masks) for b in range(64) if mask >> b & 1}
    return tuple(sorted(cpus & allowed))
