"""How the agent starts an executor process: its arguments, environment and uid.

`python -m vramfabric.worker.executor` for one GPU, in a process group of its own
(worker/executors/process_group.py), with none of the worker's settings or credentials, as its
tenant's uid in its private directory where the node contains executors.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Any

from vramfabric.broker.server import die_with_parent
from vramfabric.kernels.errors import KernelCompileError
from vramfabric.kernels.host_cache import BUILTINS_MODE, own_folder
from vramfabric.kernels.settings import CudaSettings

from ..node.gpus import GpuSpec
from . import process_group
from .containment import Sandbox, executor_env
from .process_group import GroupProcess

# The only VRAMFABRIC_ variables an executor gets, set for it here (never the worker's own).
EXECUTOR_SETTINGS = ("VRAMFABRIC_CUDA_CHECK", "VRAMFABRIC_HOST_BUILTINS", "VRAMFABRIC_HOST_CACHE")


async def start_executor(
    gpu: GpuSpec, kernel_modules: tuple[str, ...], slots: int, sandbox: Sandbox | None
) -> GroupProcess:
    """Start the executor process for `gpu`, to run up to `slots` chunks at once.

    With a `sandbox` the process runs as its uid and gid, with no supplementary groups,
    in its private directory.
    """
    args: list[str] = ["--slots", str(slots)]
    for module in kernel_modules:
        args += ["--kernel-module", module]
    # Users' code runs there: it gets none of the worker's settings, NATS credentials
    # included (VRAMFABRIC_NATS_PASSWORD, VRAMFABRIC_NATS_CREDS, ...).
    env = executor_env(os.environ, sandbox)
    # Kernels reach executors checked (by the coordinator, or this agent's prebuild):
    # importing NVRTC to check them again cost each process 0.2 s (kernels/settings.py).
    env["VRAMFABRIC_CUDA_CHECK"] = "0"
    user: dict[str, Any] = {}
    # -s: no user site-packages from HOME; -P: not the tenant's own cwd first on the path.
    flags = ["-s", "-P"] if sandbox else []
    if sandbox is not None:
        user = {"user": sandbox.uid, "group": sandbox.gid, "extra_groups": []}
        user["cwd"] = sandbox.home
    if gpu.simulated:
        args.append("--simulated")
        # The node's built-in host kernels (kernels/prebuild.py), built by this agent.
        cuda = CudaSettings.from_env()
        # Made here, as this uid's: an executor of a tenant's uid must never make it.
        with contextlib.suppress(KernelCompileError, OSError):
            own_folder(cuda.builtins_dir, BUILTINS_MODE)
        env["VRAMFABRIC_HOST_BUILTINS"] = str(cuda.builtins_dir)
        if sandbox is None:  # a contained executor builds in its own private folder
            env["VRAMFABRIC_HOST_CACHE"] = str(cuda.host_cache)
    else:
        # The process sees its GPU alone, as device 0.
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid or str(gpu.index)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if gpu.cpus:
        args += ["--cpus", ",".join(map(str, gpu.cpus))]
    # What its chunks print, read back for a failed chunk (worker/executor/captured.py): an unlinked
    # file of the agent's, which a contained executor writes through the descriptor alone.
    # Open for the process's life: GroupProcess.close_pipes closes it.
    capture = tempfile.TemporaryFile(prefix="vramfabric-executor-")  # noqa: SIM115
    try:
        return await process_group.start(
            sys.executable,
            *flags,
            "-m",
            "vramfabric.worker.executor",
            *args,
            capture=capture,
            env=env,
            # Runs after the uid switch, which would clear the parent-death signal.
            preexec_fn=die_with_parent,
            **user,
        )
    except BaseException:  # re-raised: the capture file is closed first, nothing recorded
        capture.close()
        raise
