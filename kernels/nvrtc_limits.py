"""A kernel's resources as ptxas reports them, against what its target architecture allows.

NVRTC runs ptxas for an `sm_NN` target; with `--ptxas-options=-v` its log says, for each
entry, the registers per thread and the static shared memory. A launch then needs static
plus dynamic shared memory within the architecture's opt-in maximum, and registers for
every thread of the block within the 64 K of a multiprocessor (allocated per warp in units
of 256). A GPU's driver refuses a launch past either; this says so before any lease.
"""

from __future__ import annotations

import re

import attrs

# Shared memory a block may have (static + dynamic, with the opt-in) per architecture, from
# the CUDA C++ Programming Guide's table of compute capabilities.
MAX_SHARED_BYTES = {
    "sm_70": 96 * 1024,
    "sm_72": 96 * 1024,
    "sm_75": 64 * 1024,
    "sm_80": 163 * 1024,
    "sm_86": 99 * 1024,
    "sm_87": 163 * 1024,
    "sm_89": 99 * 1024,
    "sm_90": 227 * 1024,
    "sm_90a": 227 * 1024,
    "sm_100": 227 * 1024,
    "sm_120": 99 * 1024,
}
REGISTERS_PER_SM = 65536
_REGISTER_UNIT = 256  # registers are allocated per warp, in units of 256
_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_USED = re.compile(
    r"Used (?P<regs>\d+) registers(?:, used \d+ barriers)?(?:, (?P<smem>\d+) bytes smem)?"
)
_PTXAS_ERROR = re.compile(r"ptxas (?:fatal|error)\s*:\s*(?P<what>.*)")


@attrs.frozen
class Usage:
    """What ptxas says one entry uses."""

    registers: int
    static_shared_bytes: int
    line: str


def ptxas_usage(log: str, symbol: str) -> Usage | None:
    """The usage ptxas printed for `symbol` (its lowered name), or None if not found."""
    lines = log.splitlines()
    for i, text in enumerate(lines):
        found = _ENTRY.search(text)
        if found is None or found["name"] != symbol:
            continue
        for later in lines[i + 1 : i + 6]:
            used = _USED.search(later)
            if used is not None:
                smem = int(used["smem"] or 0)
                return Usage(int(used["regs"]), smem, " ".join(later[used.start() :].split()))
    return None


def ptxas_error(log: str) -> str | None:
    """Ptxas's own error line, if the log has one."""
    for text in log.splitlines():
        found = _PTXAS_ERROR.search(text)
        if found is not None:
            return " ".join(found["what"].split())
    return None


def limit_problem(usage: Usage, arch: str, threads: int, shared_mem_bytes: int) -> str | None:
    """Why `arch` would refuse a launch of `threads` threads and `shared_mem_bytes`, or None."""
    allowed = MAX_SHARED_BYTES.get(arch)
    need = usage.static_shared_bytes + shared_mem_bytes
    if allowed is not None and need > allowed:
        return (
            f"needs {_kib(need)} of shared memory per block ({_kib(usage.static_shared_bytes)} "
            f"static + shared_mem_bytes={shared_mem_bytes}), more than {arch} allows "
            f"({_kib(allowed)})"
        )
    if threads:
        warps = -(-threads // 32)
        per_warp = -(-usage.registers * 32 // _REGISTER_UNIT) * _REGISTER_UNIT
        if warps * per_warp > REGISTERS_PER_SM:
            return (
                f"needs {warps * per_warp} registers for a block of {threads} threads "
                f"({usage.registers} per thread), more than the {REGISTERS_PER_SM} of an {arch} "
                "multiprocessor: use smaller blocks or __launch_bounds__"
            )
    return None


def _kib(n: int) -> str:
    return f"{n / 1024:g} KiB" if n % 1024 == 0 else f"{n} bytes"
