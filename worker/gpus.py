"""GPU discovery: NVML when pynvml finds GPUs, or a simulated fleet such as `4x48GiB`."""

from __future__ import annotations

import logging
import re

import attrs

log = logging.getLogger(__name__)

_UNITS = {
    "": 1,
    "B": 1,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_SIMULATE = re.compile(r"^\s*(\d+)\s*[xX]\s*(.+)$")


@attrs.frozen
class GpuSpec:
    """A GPU as the worker found it: index, model, total VRAM, and whether it is real."""

    index: int
    model: str
    total_bytes: int
    simulated: bool = True


def parse_size(text: str) -> int:
    """Parse `512MiB`, `48GiB`, `1.5GB` or a plain byte count into bytes."""
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (try 512MiB, 48GiB or a byte count)")
    n_bytes = int(float(match.group(1)) * _UNITS[unit])
    if n_bytes <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return n_bytes


def parse_simulate(spec: str) -> tuple[GpuSpec, ...]:
    """Parse `COUNTxSIZE` (e.g. `4x48GiB`) into that many simulated GPUs."""
    match = _SIMULATE.match(spec)
    if not match:
        raise ValueError(f"not a simulate spec: {spec!r} (expected COUNTxSIZE, e.g. 4x48GiB)")
    count, size = int(match.group(1)), parse_size(match.group(2))
    if not 1 <= count <= 64:
        raise ValueError(f"simulated GPU count must be 1..64, got {count}")
    return tuple(GpuSpec(i, "simulated", size, simulated=True) for i in range(count))


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
            total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpus.append(GpuSpec(i, name if isinstance(name, str) else name.decode(), total, False))
        return tuple(gpus)
    finally:
        pynvml.nvmlShutdown()
