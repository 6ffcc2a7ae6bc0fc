"""JOB.toml: a job for `vramfabric run`, read and checked with errors that name the key.

kernel = "hyperparam_eval"      # a registered kernel
aggregate = "argmin"            # argmin | argmax | mean | topk | collect
slices = 1000                   # leases to ask for (default: one per chunk, capped)
job_id = ""                     # optional; default is the hash of the spec
output_dir = "out"              # for aggregate = "collect"
kernel_modules = ["mypkg.k"]    # modules whose KERNELS are registered too
[inputs]
grid = 1000                     # hyperparam_eval's search space, or:
glob = "inputs/*.bin"           # one chunk per file, in sorted order
"""

from __future__ import annotations

import glob as globbing
import importlib
import tomllib
from pathlib import Path
from typing import Any

import attrs

from vramfabric.kernels import Kernel, KernelMissing, builtin_registry
from vramfabric.kernels.hyperparam import encode_config, search_space

from .aggregate import Aggregator, by_name
from .jobs import Job


@attrs.frozen
class JobFile:
    """A parsed JOB.toml: the job, its aggregator and how many slices to lease."""

    job: Job
    aggregator: Aggregator
    slices: int | None


def load(path: str | Path) -> JobFile:
    """Read and validate a JOB.toml; ValueError names the offending key."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    kernel = _kernel(doc)
    inputs = _inputs(doc.get("inputs"), kernel, Path(path).parent)
    if "aggregate" not in doc:
        raise ValueError("missing key 'aggregate' (argmin, argmax, mean, topk or collect)")
    aggregator = by_name(str(doc["aggregate"]), doc.get("output_dir"), int(doc.get("k", 10)))
    slices = doc.get("slices")
    if slices is not None and (not isinstance(slices, int) or slices <= 0):
        raise ValueError(f"slices must be a positive integer, got {slices!r}")
    job = Job(kernel, inputs, args=doc.get("args", {}), job_id=str(doc.get("job_id", "")))
    return JobFile(job=job, aggregator=aggregator, slices=slices)


def _kernel(doc: dict[str, Any]) -> Kernel:
    registry = builtin_registry()
    for module in doc.get("kernel_modules", []):
        registry = registry.with_kernels(importlib.import_module(module).KERNELS)
    if "kernel" not in doc:
        raise ValueError("missing key 'kernel'")
    try:
        return registry.get_kernel(str(doc["kernel"]))
    except KernelMissing as exc:
        raise ValueError(str(exc.args[0])) from None


def _inputs(spec: Any, kernel: Kernel, base: Path) -> list[bytes]:
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ValueError("[inputs] must have exactly one of 'grid' or 'glob'")
    if "grid" in spec:
        if kernel.name != "hyperparam_eval":
            raise ValueError("inputs.grid is the hyperparam_eval search space; use inputs.glob")
        return [encode_config(*c) for c in search_space(int(spec["grid"]))]
    if "glob" in spec:
        files = sorted(globbing.glob(str(base / spec["glob"])))
        if not files:
            raise ValueError(f"inputs.glob {spec['glob']!r} matches no file")
        return [Path(f).read_bytes() for f in files]
    raise ValueError(f"unknown [inputs] key {next(iter(spec))!r}; expected 'grid' or 'glob'")
