"""The checks a CudaKernel's source gets when it is built, before any lease or chunk.

NVRTC compiles it for every target architecture with CUDA's headers, and ptxas's report of
its registers and shared memory must fit its block and `shared_mem_bytes` (nvrtc.py); the
scalar kinds of its args were checked against the signature on construction
(cuda_checks.py). Then the host build (host_build.py), whose library simulated workers
load: a kernel g++ cannot build is reported here once (and kept as failed, so chunks on a
simulated worker fail at once rather than each compile again). A GPU can still run it, so
this is a warning, not a refusal; `vramfabric kernel check` fails on it.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from .errors import KernelCompileError
from .host_build import HostUnsupported, NoHostCompiler, build
from .nvrtc import check_source
from .settings import CudaSettings

if TYPE_CHECKING:
    from .cuda_shape import CudaShape

log = logging.getLogger(__name__)


def precheck(kernel: CudaShape, settings: CudaSettings) -> None:
    """NVRTC (with headers and the launch's resources), then the host build.

    Raises:
        CudaSourceError: NVRTC refuses it, or it needs more than an architecture gives.
    """
    check_source(
        kernel.name,
        kernel.source,
        kernel.entry,
        settings.archs,
        settings.cache(),
        threads=math.prod(kernel.block),
        shared_mem_bytes=kernel.shared_mem_bytes,
        include=settings.cuda_include,
    )
    problem = host_build_problem(kernel, settings)
    if problem:
        log.warning("%s", problem)


def host_build_problem(kernel: CudaShape, settings: CudaSettings) -> str | None:
    """Why the host path cannot run the kernel, or None (also None without g++ here)."""
    try:
        build(kernel.name, kernel.source, kernel.entry, settings.cache())
    except NoHostCompiler:
        return None
    except HostUnsupported as exc:
        return f"{exc} (simulated workers cannot run it)"
    except KernelCompileError as exc:
        return f"{exc} (simulated workers cannot run it: the host path lacks what it uses)"
    return None
