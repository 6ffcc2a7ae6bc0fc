"""Host-path benchmark: each built-in CUDA kernel's source run on the CPU, against its reference.

For each of the five built-in kernels, in one process with empty caches (a temporary
`VRAMFABRIC_HOST_CACHE`): the checks when the kernel is built (`check_s`: NVRTC with
ptxas's resource report, and the plain host build with g++), the first chunk on the host
path (`first_build_s`: the library is loaded), then per-chunk wall time over the demo's
inputs on one thread, on the host path and for the NumPy reference run directly
(`host_us`, `reference_us`: medians of `--runs` passes). Check mode (kernels/host_check.py):
the check build's g++ (`check_build_s`) and the per-chunk cost of a chunk run in check mode
(`check_us`: two runs of the instrumented build, two schedules compared) over the first
`--check-chunks` inputs, with `check_over_host`. One JSON line.

    python bench/hostpath.py              # 3 passes
    python bench/hostpath.py --runs 5 --check-chunks 50
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np


def per_chunk_us(run: Callable[[bytes], bytes], inputs: list[bytes], runs: int) -> float:
    """Median over `runs` passes of the mean wall time of one chunk, in microseconds."""
    passes = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for data in inputs:
            run(data)
        passes.append((time.perf_counter() - t0) / len(inputs) * 1e6)
    return round(statistics.median(passes), 1)


# What builds the CudaKernel, its reference on NumPy, what makes the demo's inputs (called
# after the kernel is built: the demo's patterns build theirs, which would check it first).
Case = tuple[Callable[[], object], Callable[[bytes], bytes], Callable[[], list[bytes]]]


def cases() -> dict[str, Case]:
    """The cases by kernel name."""
    from vramfabric.demo_patterns import PATTERNS
    from vramfabric.kernels import fitness, hyperparam, inference, montecarlo, tiles

    found: dict[str, Case] = {
        "hyperparam": (
            hyperparam.cuda_kernel,
            lambda data: hyperparam.HYPERPARAM_EVAL.run(np, {}, data),
            lambda: [hyperparam.encode_config(*c) for c in hyperparam.search_space(1000)],
        )
    }
    modules = {"montecarlo": montecarlo, "inference": inference, "tiles": tiles, "fitness": fitness}
    for name, module in modules.items():
        found[name] = (
            module.cuda_kernel,
            lambda data, ref=module.reference: ref(np, data),  # type: ignore[misc]
            lambda name=name: PATTERNS[name]().inputs,  # type: ignore[misc]
        )
    return found


def bench(runs: int, check_chunks: int) -> dict[str, object]:
    """Time every built-in kernel; the results by kernel name."""
    from vramfabric.kernels import nvrtc

    nvrtc.nvrtc_module()  # imported before any timing
    results: dict[str, object] = {}
    for name, (make, reference, make_inputs) in cases().items():
        t0 = time.perf_counter()
        kernel = make()
        check_s = time.perf_counter() - t0
        inputs = make_inputs()
        t0 = time.perf_counter()
        kernel.run_host(inputs[0])  # type: ignore[attr-defined]
        first_build_s = time.perf_counter() - t0
        host_us = per_chunk_us(kernel.run_host, inputs, runs)  # type: ignore[attr-defined]
        reference_us = per_chunk_us(reference, inputs, runs)
        t0 = time.perf_counter()
        kernel.check_host(inputs[0])  # type: ignore[attr-defined]
        check_build_s = time.perf_counter() - t0
        checked = inputs[:check_chunks]
        check_us = per_chunk_us(kernel.check_host, checked, 1)  # type: ignore[attr-defined]
        results[name] = {
            "chunks": len(inputs),
            "check_s": round(check_s, 3),
            "first_build_s": round(first_build_s, 3),
            "host_us": host_us,
            "reference_us": reference_us,
            "host_over_reference": round(host_us / reference_us, 2),
            "check_build_s": round(check_build_s, 3),
            "check_chunks": len(checked),
            "check_us": check_us,
            "check_over_host": round(check_us / host_us, 1),
        }
    return results


def main() -> int:
    """Parse flags, time each kernel with empty caches, print one JSON line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--check-chunks", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vf-bench-host-") as folder:
        # Empty caches: the first chunk of each kernel pays its g++ build, as on a new machine.
        os.environ["VRAMFABRIC_HOST_CACHE"] = os.path.join(folder, "cache")
        os.environ["VRAMFABRIC_HOST_BUILTINS"] = os.path.join(folder, "builtins")
        # Plain chunks: check mode is timed on its own (check_us), not on the first chunk.
        os.environ["VRAMFABRIC_HOST_CHECK"] = "off"
        kernels = bench(args.runs, args.check_chunks)
    line = {
        "bench": "hostpath",
        "kernels": kernels,
        "runs": args.runs,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
