"""JOB.toml: a job for `vramfabric run`, read and checked with errors that name the key.

kernel = "hyperparam_eval"      # a registered kernel, or a [cuda] table (exactly one)
aggregate = "argmin"            # argmin | argmax | mean | topk | gather | collect
k = 10                          # for aggregate = "topk"
slices = 1000                   # leases to ask for (default: one per chunk, capped)
job_id = ""                     # optional; default is the hash of the spec
timeout_s = 600                 # optional: each chunk's deadline (default: the worker's)
chunks_per_message = 0          # optional: 0 packs tiny chunks (auto), 1 never, N up to N
output_dir = "out"              # for aggregate = "collect"
kernel_modules = ["mypkg.k"]    # modules whose KERNELS are registered too
[inputs]
grid = 1000                     # hyperparam_eval's search space, or:
glob = "inputs/*.bin"           # one chunk per file, in sorted order

A CUDA kernel of your own instead of `kernel` (file paths are relative to the JOB.toml):

[cuda]
source_file = "saxpy.cu"        # CUDA C++ (compiled with NVRTC), or ptx_file = "saxpy.ptx"
entry = "saxpy"                 # the extern "C" __global__ function
grid = [64]                     # 1 to 3 ints, padded with 1
block = [256]
args = ["in", "out", {f32 = 2.0}, "in_bytes"]   # in/out buffers, the input's length as a
                                                # u64, scalars: f32 f64 i32 u32 i64 u64
max_output_bytes = 4096         # the zeroed `out` buffer, returned whole
max_input_bytes = 4096          # optional (default 1000000)
output_dtype = "float32"        # optional: how aggregators read the output
shared_mem_bytes = 0            # optional: dynamic shared memory per block
name = "saxpy"                  # optional (default: the entry)
reference = "ref:saxpy"         # optional module:function(xp, data) -> bytes that simulated
                                # GPUs run; imported here (this folder first), sent by value
"""

from __future__ import annotations

import glob as globbing
import importlib
import sys
import tomllib
from pathlib import Path
from typing import Any

import attrs

from vramfabric.broker.subjects import MAX_PACK_CHUNKS
from vramfabric.kernels import (
    ArgSpec,
    CudaKernel,
    Kernel,
    KernelArgumentError,
    KernelMissing,
    builtin_registry,
)
from vramfabric.kernels.cuda import Reference
from vramfabric.kernels.hyperparam import MAX_BATCH, encode_config, search_space

from ..aggregate import Aggregator, by_name
from .job import Job, check_args

_CUDA_REQUIRED = ("entry", "grid", "block", "args", "max_output_bytes")
_CUDA_OPTIONAL = (
    "source_file",
    "ptx_file",
    "max_input_bytes",
    "output_dtype",
    "shared_mem_bytes",
    "name",
    "reference",
)

# hyperparam_eval's search space: config i has batch size 32 * (1 + i // 100), and past
# MAX_BATCH the kernel refuses it (every chunk past the space would fail as launch_failed).
GRID_MAX = 100 * (MAX_BATCH // 32)
_KIND_NAMES = {str: "a string", int: "an integer", list: "an array"}


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
    base = Path(path).parent
    kernel = _kernel(doc, base)
    inputs = _inputs(doc.get("inputs"), kernel, base)
    if "aggregate" not in doc:
        raise ValueError("missing key 'aggregate' (argmin, argmax, mean, topk, gather or collect)")
    aggregator = by_name(str(doc["aggregate"]), doc.get("output_dir"), int(doc.get("k", 10)))
    slices = doc.get("slices")
    if slices is not None and (not isinstance(slices, int) or slices <= 0):
        raise ValueError(f"slices must be a positive integer, got {slices!r}")
    timeout_s = doc.get("timeout_s")
    if timeout_s is not None and (
        not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or timeout_s <= 0
    ):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    per_message = doc.get("chunks_per_message")
    if per_message is not None and (
        not isinstance(per_message, int)
        or isinstance(per_message, bool)
        or not 0 <= per_message <= MAX_PACK_CHUNKS
    ):
        raise ValueError(
            f"chunks_per_message must be an integer from 0 to {MAX_PACK_CHUNKS}, "
            f"got {per_message!r}"
        )
    args = doc.get("args", {})
    if not isinstance(args, dict):
        raise ValueError(f"args must be a table ([args]), got {args!r}")
    check_args(args)
    job = Job(
        kernel,
        inputs,
        args=args,
        job_id=str(doc.get("job_id", "")),
        timeout_s=None if timeout_s is None else float(timeout_s),
        chunks_per_message=per_message,
    )
    return JobFile(job=job, aggregator=aggregator, slices=slices)


def _kernel(doc: dict[str, Any], base: Path) -> Kernel | CudaKernel:
    if "kernel" in doc and "cuda" in doc:
        raise ValueError("give either key 'kernel' or a [cuda] table, not both")
    if "cuda" in doc:
        if "args" in doc:
            raise ValueError("key 'args' is for registered kernels; a CUDA kernel's go in [cuda]")
        return _cuda(doc["cuda"], base)
    if "kernel" not in doc:
        raise ValueError("missing key 'kernel' (a registered kernel) or a [cuda] table")
    registry = builtin_registry()
    for module in doc.get("kernel_modules", []):
        registry = registry.with_kernels(importlib.import_module(module).KERNELS)
    try:
        return registry.get_kernel(str(doc["kernel"]))
    except KernelMissing as exc:
        raise ValueError(str(exc.args[0])) from None


def _cuda(table: Any, base: Path) -> CudaKernel:
    _check_keys(table)
    fields: dict[str, Any] = _code(table, base)
    fields["entry"] = fields["name"] = _typed(table, "entry", str)
    for key in ("name", "output_dtype"):
        if key in table:
            fields[key] = _typed(table, key, str)
    for key in ("max_output_bytes", "max_input_bytes", "shared_mem_bytes"):
        if key in table:
            fields[key] = _typed(table, key, int)
    fields["grid"], fields["block"] = _dims(table, "grid"), _dims(table, "block")
    fields["args"] = tuple(_arg(i, a) for i, a in enumerate(_typed(table, "args", list)))
    if "reference" in table:
        fields["reference"] = _reference(_typed(table, "reference", str), base)
    try:
        kernel = CudaKernel(**fields)
    except KernelArgumentError as exc:
        raise ValueError(f"[cuda] {exc}") from None
    try:
        kernel.to_blob()
    except TypeError as exc:
        raise ValueError(f"cuda.reference: {exc}") from None
    return kernel


def _check_keys(table: Any) -> None:
    if not isinstance(table, dict):
        raise ValueError(f"cuda must be a table, got {table!r}")
    for key in table:
        if key not in (*_CUDA_REQUIRED, *_CUDA_OPTIONAL):
            known = ", ".join((*_CUDA_REQUIRED, *_CUDA_OPTIONAL))
            raise ValueError(f"unknown key cuda.{key}; expected one of {known}")
    for key in _CUDA_REQUIRED:
        if key not in table:
            raise ValueError(f"missing key cuda.{key}")


def _code(table: dict[str, Any], base: Path) -> dict[str, Any]:
    keys = [key for key in ("source_file", "ptx_file") if key in table]
    if len(keys) != 1:
        raise ValueError("[cuda] needs exactly one of cuda.source_file and cuda.ptx_file")
    path = base / _typed(table, keys[0], str)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cuda.{keys[0]}: cannot read {path}: {exc}") from None
    return {"source" if keys[0] == "source_file" else "ptx": text}


def _typed(table: dict[str, Any], key: str, kind: type) -> Any:
    value = table[key]
    # TOML booleans are not integers here.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"cuda.{key} must be {_KIND_NAMES[kind]}, got {value!r}")
    return value


def _dims(table: dict[str, Any], key: str) -> tuple[int, ...]:
    value = table[key]
    dims = [value] if isinstance(value, int) else value
    ints = isinstance(dims, list) and all(type(d) is int for d in dims)
    if not ints or not 1 <= len(dims) <= 3:
        raise ValueError(f"cuda.{key} must be an array of 1 to 3 ints, got {value!r}")
    return (*dims, *(1,) * (3 - len(dims)))


def _arg(i: int, value: Any) -> ArgSpec:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((kind, number),) = value.items()
        return (kind, number)
    raise ValueError(
        f'cuda.args[{i}] must be "in", "out", "in_bytes" or a table like {{f32 = 2.0}}, '
        f"got {value!r}"
    )


def _reference(spec: str, base: Path) -> Reference:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"cuda.reference must be 'module:function', got {spec!r}")
    # The job file's folder first: a ref.py beside it imports without PYTHONPATH.
    folder = str(base.resolve())
    sys.path.insert(0, folder)
    try:
        fn: Reference = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, SyntaxError) as exc:
        raise ValueError(f"cuda.reference {spec!r}: {exc}") from None
    finally:
        sys.path.remove(folder)
    if not callable(fn):
        raise ValueError(f"cuda.reference {spec!r} is not callable")
    return fn


def _grid(value: Any) -> int:
    # Past GRID_MAX the configurations leave the kernel's range (every one would fail).
    if type(value) is not int or not 1 <= value <= GRID_MAX:
        raise ValueError(
            f"inputs.grid must be an integer from 1 to {GRID_MAX} (hyperparam_eval's search "
            f"space has {GRID_MAX} configurations), got {value!r}"
        )
    return value


def _inputs(spec: Any, kernel: Kernel | CudaKernel, base: Path) -> list[bytes]:
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ValueError("[inputs] must have exactly one of 'grid' or 'glob'")
    if "grid" in spec:
        if not isinstance(kernel, Kernel) or kernel.name != "hyperparam_eval":
            raise ValueError("inputs.grid is the hyperparam_eval search space; use inputs.glob")
        return [encode_config(*c) for c in search_space(_grid(spec["grid"]))]
    if "glob" in spec:
        files = sorted(globbing.glob(str(base / spec["glob"])))
        if not files:
            raise ValueError(f"inputs.glob {spec['glob']!r} matches no file")
        limit = kernel.max_input_bytes
        for f in files:
            if (size := Path(f).stat().st_size) > limit:
                raise ValueError(
                    f"inputs.glob: {f} is {size} bytes; kernel {kernel.name} takes at most "
                    f"{limit} (max_input_bytes)"
                )
        return [Path(f).read_bytes() for f in files]
    raise ValueError(f"unknown [inputs] key {next(iter(spec))!r}; expected 'grid' or 'glob'")
