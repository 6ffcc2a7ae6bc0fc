"""CudaSettings: where CUDA sources are checked and run without a GPU, read from the environment.

`VRAMFABRIC_CUDA_ARCHS` (default `sm_80,sm_90`) lists the architectures NVRTC compiles every
CUDA kernel for; `VRAMFABRIC_HOST_CACHE` is the folder of the host path's compiled libraries
(and NVRTC's verdicts); `VRAMFABRIC_HOST_BUILTINS` is the node's folder of the built-in
kernels' libraries (default: the host cache's name with `-builtins`), which the node agent
fills and passes to its executors. `VRAMFABRIC_CUDA_CHECK=0` turns the compile check off:
executors run with it off, since whoever built the kernel (the coordinator, the agent for
registered ones) checked it, and importing NVRTC cost each executor process 0.2 s.
`VRAMFABRIC_HOST_CHECK` (`first`, the default; `all`; `off`) says which chunks of a user's
CUDA kernel the host path runs in check mode (host_check.py): the first a process runs of
each kernel, every one, or none. `VRAMFABRIC_CUDA_INCLUDE` names the folder of CUDA's headers
(cuda_fp16.h) for NVRTC, when cuda_headers.py does not find one.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import attrs

from .host_cache import BUILTINS_MODE, HostCache

DEFAULT_ARCHS = ("sm_80", "sm_90")
HOST_CHECKS = ("first", "all", "off")
_ARCH = re.compile(r"sm_\d{2,3}[a-z]?")


def parse_archs(text: str) -> tuple[str, ...]:
    """`"sm_80,sm_90"` -> ("sm_80", "sm_90").

    Raises:
        ValueError: empty, or a name that is not `sm_NN`.
    """
    archs = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in archs if not _ARCH.fullmatch(a)]
    if not archs or bad:
        raise ValueError(f"CUDA architectures must be like sm_80,sm_90; got {text!r}")
    return archs


def _default_cache() -> Path:
    # Per user: another user's folder could hold libraries this process would load.
    return Path(tempfile.gettempdir()) / f"vramfabric-host-{os.getuid()}"


@attrs.frozen
class CudaSettings:
    """NVRTC's target architectures and the host path's library caches."""

    archs: tuple[str, ...] = DEFAULT_ARCHS
    host_cache: Path = attrs.field(factory=_default_cache)
    host_builtins: Path | None = None
    check: bool = True
    host_check: str = "first"
    cuda_include: str = ""

    @property
    def builtins_dir(self) -> Path:
        """The node's folder of built-in kernels' libraries."""
        # Beside the host cache, not in it: that one is 0700 and executors of other uids read this.
        return self.host_builtins or self.host_cache.with_name(f"{self.host_cache.name}-builtins")

    def cache(self) -> HostCache:
        """The host cache: this process's folder, and the node's built-ins to read first."""
        return HostCache(self.host_cache, self.builtins_dir)

    def builtins_cache(self) -> HostCache:
        """Where the node's own kernels are built: the built-ins folder, if this uid owns it.

        So a shared-uid executor and the agent's prebuild share one build; an executor of a
        tenant's uid reads that folder (the agent's) and builds in `cache()`.
        """
        folder = self.builtins_dir
        if folder.exists() and folder.stat().st_uid != os.getuid():
            return self.cache()
        return HostCache(folder, own_mode=BUILTINS_MODE)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CudaSettings:
        """Read the `VRAMFABRIC_` variables of the module's docstring.

        Raises:
            ValueError: VRAMFABRIC_CUDA_ARCHS or VRAMFABRIC_HOST_CHECK is malformed.
        """
        host_check = environ.get("VRAMFABRIC_HOST_CHECK", "first")
        if host_check not in HOST_CHECKS:
            raise ValueError(
                f"VRAMFABRIC_HOST_CHECK must be one of {HOST_CHECKS}, got {host_check!r}"
            )
        archs = environ.get("VRAMFABRIC_CUDA_ARCHS")
        cache = environ.get("VRAMFABRIC_HOST_CACHE")
        builtins = environ.get("VRAMFABRIC_HOST_BUILTINS")
        return cls(
            archs=parse_archs(archs) if archs else DEFAULT_ARCHS,
            host_cache=Path(cache) if cache else _default_cache(),
            host_builtins=Path(builtins) if builtins else None,
            check=environ.get("VRAMFABRIC_CUDA_CHECK", "1") != "0",
            host_check=host_check,
            cuda_include=environ.get("VRAMFABRIC_CUDA_INCLUDE", ""),
        )
