"""GPU discovery: NVML when pynvml finds GPUs, or a simulated fleet such as `4x48GiB`."""

from __future__ import annotations

import logging
import os
import re

import attrs

from vramfabric.broker.messages import SIMULATED_MODEL
from vramfabric.broker.settings import parse_size

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


def discover_nvml() -> tuple[GpuSpec, ...]:
    """The node's real GPUs through NVML; empty when pynvml or a driver is missing."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError subclasses differ by driver state
        log.info("nvml unavailable error=%s", exc)
        return ()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpus.append(
                GpuSpec(
                    i,
                    name if isinstance(name, str) else name.decode(),
                    total,
                    simulated=False,
                    uuid=uuid if isinstance(uuid, str) else uuid.decode(),
                    cpus=_local_cpus(pynvml, handle),
                )
            )
        return tuple(gpus)
    finally:
        pynvml.nvmlShutdown()


def _local_cpus(pynvml: object, handle: object) -> tuple[int, ...]:
    """The cores NVML calls close to the GPU, within this process's allowed set."""
    allowed = os.sched_getaffinity(0)
    words = (max(allowed) // 64) + 1
    try:
        masks = pynvml.nvmlDeviceGetCpuAffinity(handle, words)  # type: ignore[attr-defined]
    except Exception as exc:  # NVMLError_NotSupported on some boards and in containers
        log.info("no cpu affinity from nvml error=%s", exc)
        return ()
    cpus = {w * 64 + b for w, mask in enumerate(masks) for b in range(64) if mask >> b & 1}
    return tuple(sorted(cpus & allowed))
