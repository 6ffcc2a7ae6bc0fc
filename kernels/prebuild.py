"""Building the registered kernels' host libraries when a node starts, for its executors.

A simulated node's agent builds, in the background, the host-path library of each
registered kernel that has a CUDA version (the project's own code, or an operator's
`--kernel-module`: never a tenant's) into the node's built-ins folder (mode 0755). Its
executors, of any uid, find them there (host_cache.py) instead of each building their own;
one that needs a library the agent is still building waits for it. N workers of one uid on
a machine share the folder, and its lock: one g++ per kernel per machine.
"""

from __future__ import annotations

import logging
import threading
import time

from .host_build import build
from .host_cache import BUILTINS_MODE, HostCache
from .registry import Registry
from .settings import CudaSettings

log = logging.getLogger(__name__)


def prebuild(registry: Registry, settings: CudaSettings) -> list[str]:
    """Build the host library of each kernel with a CUDA version.

    Returns:
        The names of the kernels built or found built.

    Raises:
        KernelCompileError: one did not build (g++ missing or failed), or the folder is not
            this user's alone.
    """
    cache = HostCache(settings.builtins_dir, own_mode=BUILTINS_MODE)
    names = []
    for kernel in registry.values():
        if kernel.cuda is None:
            continue
        cuda = kernel.cuda()  # compile-checked here (executors do not check)
        build(cuda.name, cuda.source, cuda.entry, cache)
        names.append(kernel.name)
    return names


def start_prebuild(registry: Registry, settings: CudaSettings) -> threading.Thread:
    """Run `prebuild` on a daemon thread; its outcome is logged (executors build on failure)."""

    def run() -> None:
        started = time.monotonic()
        try:
            names = prebuild(registry, settings)
        except Exception as exc:  # recorded: logged, and each executor builds its own instead
            log.warning(
                "built-in host kernels not prebuilt folder=%s error=%s", settings.builtins_dir, exc
            )
            return
        log.info(
            "built-in host kernels ready kernels=%s folder=%s in_s=%.2f",
            ",".join(names),
            settings.builtins_dir,
            time.monotonic() - started,
        )

    thread = threading.Thread(target=run, name="vf-prebuild", daemon=True)
    thread.start()
    return thread
