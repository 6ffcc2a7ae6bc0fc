"""`vramfabric kernel check`: every check of a CUDA kernel that needs no GPU, before a lease.

For a `.cu` file and its entry: NVRTC for the target architectures with CUDA's headers,
ptxas's registers and shared memory against the launch (`--block`, `--shared-mem-bytes`),
then the host build g++ makes for simulated workers, plain and for check mode. For a
JOB.toml with a `[cuda]` table: the same for its kernel (and its args against the
signature), then its first `--chunks` inputs run in check mode on the host path (races,
shared memory read before written, bounds, barriers, warps, two schedules compared).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from .exits import RET_FAILED, RET_OK, RET_USAGE
from .report import err


def add_parser(kernel: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `kernel check` command."""
    p = kernel.add_parser(
        "check",
        help="check FILE.cu (NVRTC, resources, host build) or a JOB.toml's kernel and chunks",
    )
    p.add_argument("file", help="a .cu source, or a JOB.toml with a [cuda] table")
    p.add_argument("--entry", help='the __global__ function (extern "C", or its mangled name)')
    p.add_argument("--arch", help="e.g. sm_90 or sm_80,sm_90 (default VRAMFABRIC_CUDA_ARCHS)")
    p.add_argument("--block", help="threads per block, e.g. 256 or 16,16 (checks registers)")
    p.add_argument("--shared-mem-bytes", type=int, default=0, help="dynamic shared memory")
    p.add_argument("--chunks", type=int, default=1, help="a JOB.toml's inputs to run checked")
    p.set_defaults(handler=cmd_kernel_check)


def cmd_kernel_check(args: argparse.Namespace) -> int:
    """Run the checks; exit 0 when all pass, 1 naming the first failure, 2 for bad usage."""
    from vramfabric.kernels.settings import CudaSettings, parse_archs

    path = Path(args.file)
    try:
        archs = parse_archs(args.arch) if args.arch else CudaSettings.from_env().archs
        block = [int(n) for n in args.block.split(",")] if args.block else []
    except ValueError as exc:
        err.print(f"vramfabric: {exc}")
        return RET_USAGE
    if path.suffix == ".toml":
        return _check_job(path, args.chunks)
    if not args.entry:
        err.print("vramfabric: --entry is needed for a .cu file")
        return RET_USAGE
    try:
        source = path.read_text()
    except OSError as exc:
        err.print(f"vramfabric: cannot read {path}: {exc}")
        return RET_USAGE
    return _check_source(path, source, args.entry, archs, block, args.shared_mem_bytes)


def _check_source(
    path: Path, source: str, entry: str, archs: tuple[str, ...], block: list[int], shared: int
) -> int:
    from vramfabric.kernels.errors import KernelCompileError
    from vramfabric.kernels.host_build import NoHostCompiler, build
    from vramfabric.kernels.nvrtc import check_source
    from vramfabric.kernels.settings import CudaSettings

    settings = CudaSettings.from_env()
    try:
        threads = math.prod(block) if block else 0
        checked = check_source(
            path.stem, source, entry, archs, None, threads, shared, settings.cuda_include
        )
    except KernelCompileError as exc:
        err.print(f"vramfabric: {exc}")
        return RET_FAILED
    if not checked:
        err.print("vramfabric: nvrtc not installed (pip install 'vramfabric[cuda]'): not checked")
        return RET_FAILED
    print(f"{path}: {entry} compiles for {','.join(archs)}")
    try:
        for check in (False, True):
            build(path.stem, source, entry, settings.cache(), check=check)
    except NoHostCompiler as exc:
        print(f"{path}: host path not checked: {exc}")
        return RET_OK
    except KernelCompileError as exc:
        err.print(f"vramfabric: host path: {exc}")
        return RET_FAILED
    print(f"{path}: {entry} builds for the host path (plain and check mode)")
    return RET_OK


def _check_job(path: Path, chunks: int) -> int:
    from vramfabric.coordinator.jobs.jobfile import load
    from vramfabric.kernels import CudaKernel
    from vramfabric.kernels.cuda_precheck import host_build_problem
    from vramfabric.kernels.errors import KernelArgumentError, KernelCompileError
    from vramfabric.kernels.settings import CudaSettings

    try:
        job = load(path).job
    except (ValueError, OSError) as exc:  # a bad kernel is a ValueError too (it names the line)
        err.print(f"vramfabric: {path}: {exc}")
        return RET_FAILED
    kernel = job.kernel
    if not isinstance(kernel, CudaKernel) or not kernel.source:
        err.print(f"vramfabric: {path}: no [cuda] table with a source_file to check")
        return RET_USAGE
    problem = host_build_problem(kernel, CudaSettings.from_env())
    if problem:
        err.print(f"vramfabric: host path: {problem}")
        return RET_FAILED
    inputs = list(job.inputs)[: max(chunks, 0)] if isinstance(job.inputs, list) else []
    for index, data in enumerate(inputs):
        try:
            kernel.check_host(bytes(data))
        except (KernelArgumentError, KernelCompileError) as exc:
            err.print(f"vramfabric: chunk {index}: {exc}")
            return RET_FAILED
    print(
        f"{path}: {kernel.entry} compiles, fits its launch, builds for the host path, and "
        f"{len(inputs)} chunk(s) ran clean in check mode"
    )
    return RET_OK
