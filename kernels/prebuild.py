"""Building the registered kernels' host libraries when a node starts, for its executors.

A simulated node's agent runs `python -m vramfabric.kernels.prebuild` in the background
once its executors are up: it builds the host-path library of each registered kernel that
has a CUDA version (the project's own code, or an operator's `--kernel-module`: never a
tenant's) into the node's built-ins folder (mode 0755). Its executors, of any uid, find
them there (host_cache.py) instead of each building their own; one that needs a library
being built waits for it. N workers of one uid on a machine share the folder, and its lock:
one g++ per kernel per machine. A process of its own, without the NVRTC check (CI checks
the registered kernels; it cost 1.1 s before the build could start): the agent imports
neither NVRTC nor the kernels' sources.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import threading
import time

from .host_build import build
from .host_cache import BUILTINS_MODE, HostCache
from .registry import Registry, load_registry
from .settings import CudaSettings

log = logging.getLogger(__name__)


def prebuild(registry: Registry, settings: CudaSettings) -> list[str]:
    """Build the host library of each kernel with a CUDA version into the built-ins folder.

    Returns:
        The names of the kernels built or found built.

    Raises:
        KernelCompileError: one did not build (g++ missing or failed), or the folder is not
            this user's alone.
    """
    cache = HostCache(settings.builtins_dir, own_mode=BUILTINS_MODE)  # refused if not ours
    names = []
    for kernel in registry.values():
        if kernel.cuda is None:
            continue
        cuda = kernel.cuda()
        build(cuda.name, cuda.source, cuda.entry, cache)
        names.append(kernel.name)
    return names


def start_prebuild(kernel_modules: tuple[str, ...]) -> threading.Thread:
    """Run the prebuild in a process of its own, watched by a daemon thread that logs it."""
    command = [sys.executable, "-m", "vramfabric.kernels.prebuild"]
    for module in kernel_modules:
        command += ["--kernel-module", module]
    env = dict(os.environ, VRAMFABRIC_CUDA_CHECK="0")

    def run() -> None:
        started = time.monotonic()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        lines = (done.stdout + done.stderr).strip().splitlines() or ["(no output)"]
        level = logging.INFO if done.returncode == 0 else logging.WARNING
        # A failure is recorded here; executors then build their own libraries.
        log.log(level, "built-in host kernels: %s in_s=%.2f", lines[-1], time.monotonic() - started)

    thread = threading.Thread(target=run, name="vf-prebuild", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m vramfabric.kernels.prebuild`; exit 1 if a build failed."""
    parser = argparse.ArgumentParser(prog="vramfabric-prebuild")
    parser.add_argument("--kernel-module", action="append", default=[])
    args = parser.parse_args(argv)
    from . import builtin_registry

    settings = CudaSettings.from_env()
    try:
        names = prebuild(load_registry(builtin_registry(), args.kernel_module), settings)
    except Exception as exc:  # recorded: printed for the agent's log, exit 1
        print(f"not prebuilt folder={settings.builtins_dir} error={exc}", flush=True)
        return 1
    print(f"ready kernels={','.join(names)} folder={settings.builtins_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
