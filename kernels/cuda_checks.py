"""Validation of a CudaKernel's fields: each check names the field it rejects.

Also the arg vocabulary ("in", "out", "in_bytes" and typed scalars), CUDA's launch limits,
and the converters that turn lists (as msgpack and TOML give them) into tuples.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from .cuda_signature import ptx_params, source_params
from .errors import KernelArgumentError

if TYPE_CHECKING:
    from .cuda_shape import ArgSpec, CudaShape

# The scalar arg types and the NumPy scalars they are passed as.
SCALAR_TYPES: dict[str, type[np.generic]] = {
    "f32": np.float32,
    "f64": np.float64,
    "i32": np.int32,
    "u32": np.uint32,
    "i64": np.int64,
    "u64": np.uint64,
}
IN_BYTES = "in_bytes"
# CUDA's limits on every GPU since compute capability 3.0.
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)

_ARG_BYTES = {"in": 8, "out": 8, IN_BYTES: 8, "f32": 4, "f64": 8, "i32": 4, "u32": 4}
_ARG_BYTES |= {"i64": 8, "u64": 8}
_RANGES: dict[str, tuple[float, float]] = {
    "f32": (0.0, float(np.finfo(np.float32).max)),
    "f64": (0.0, sys.float_info.max),
    "i32": (-(2**31), 2**31 - 1),
    "u32": (0, 2**32 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "u64": (0, 2**64 - 1),
}


def dim3(value: Any) -> Any:
    """Lists become tuples and 1-2 dims are padded with 1; the validator reports the rest."""
    if isinstance(value, list | tuple) and 1 <= len(value) <= 3:
        return (*value, 1, 1)[:3]
    return value


def arg_specs(value: Any) -> Any:
    """Lists (as msgpack and TOML give them) become tuples; the validator reports the rest."""
    if isinstance(value, list | tuple):
        return tuple(tuple(a) if isinstance(a, list) else a for a in value)
    return value


def validate(kernel: CudaShape) -> None:
    """Check every field, and the args against the entry's signature where it can be read.

    Raises:
        KernelArgumentError: naming the kernel and the field at fault.
    """
    for field in ("name", "entry", "source", "ptx"):
        if not isinstance(getattr(kernel, field), str):
            _fail(kernel, field, f"must be a string, got {getattr(kernel, field)!r}")
    for field in ("name", "entry"):
        if not getattr(kernel, field).strip():
            _fail(kernel, field, "must not be empty")
    if bool(kernel.source) == bool(kernel.ptx):
        both = "both are set" if kernel.source else "neither is set"
        _fail(kernel, "source/ptx", f"give exactly one of CUDA source or PTX ({both})")
    _check_dims(kernel, "grid", kernel.grid, MAX_GRID)
    _check_dims(kernel, "block", kernel.block, MAX_BLOCK)
    if math.prod(kernel.block) > MAX_THREADS_PER_BLOCK:
        threads = math.prod(kernel.block)
        _fail(kernel, "block", f"{kernel.block} is {threads} threads; at most 1024 per block")
    _check_args(kernel)
    _check_sizes(kernel)
    if kernel.reference is not None and not callable(kernel.reference):
        _fail(kernel, "reference", f"must be callable(xp, data) -> bytes, got {kernel.reference!r}")
    _check_signature(kernel)


def _fail(kernel: CudaShape, field: str, detail: str) -> NoReturn:
    raise KernelArgumentError(f"CudaKernel {kernel.name!r}: {field}: {detail}")


def _check_dims(kernel: CudaShape, field: str, dims: Any, limits: tuple[int, ...]) -> None:
    ints = isinstance(dims, tuple) and len(dims) == 3
    if not ints or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        _fail(kernel, field, f"must be 1 to 3 ints, got {dims!r}")
    for axis, dim, limit in zip("xyz", dims, limits, strict=True):
        if not 1 <= dim <= limit:
            _fail(kernel, field, f"{axis}={dim} outside 1..{limit}")


def _check_args(kernel: CudaShape) -> None:
    if not isinstance(kernel.args, tuple):
        _fail(kernel, "args", f"must be a sequence, got {kernel.args!r}")
    for i, arg in enumerate(kernel.args):
        problem = _arg_problem(arg)
        if problem:
            _fail(kernel, f"args[{i}]", problem)
    outs, ins = kernel.args.count("out"), kernel.args.count("in")
    if outs != 1:
        _fail(kernel, "args", f"needs exactly one 'out', got {outs}")
    if ins > 1:
        _fail(kernel, "args", f"at most one 'in' (the chunk's bytes), got {ins}")


def _arg_problem(arg: Any) -> str | None:
    expected = f"'in', 'out', '{IN_BYTES}' or (type, value) with type in {', '.join(SCALAR_TYPES)}"
    if isinstance(arg, str):
        return None if arg in ("in", "out", IN_BYTES) else f"expected {expected}, got {arg!r}"
    if not (isinstance(arg, tuple) and len(arg) == 2 and str(arg[0]) in SCALAR_TYPES):
        return f"expected {expected}, got {arg!r}"
    kind, value = arg
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{kind} value must be a number, got {value!r}"
    low, high = _RANGES[kind]
    if kind[0] == "f":
        finite = isinstance(value, int) or math.isfinite(value)
        return f"{value!r} is out of the {kind} range" if finite and abs(value) > high else None
    if not isinstance(value, int):
        return f"{kind} value must be an integer, got {value!r}"
    return None if low <= value <= high else f"{value} outside the {kind} range {low}..{high}"


def _check_sizes(kernel: CudaShape) -> None:
    for field, least in (("max_output_bytes", 1), ("max_input_bytes", 0), ("shared_mem_bytes", 0)):
        value = getattr(kernel, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            _fail(kernel, field, f"must be an int >= {least}, got {value!r}")
    try:
        dtype = np.dtype(kernel.output_dtype) if isinstance(kernel.output_dtype, str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.hasobject or dtype.itemsize == 0:
        _fail(kernel, "output_dtype", f"must name a NumPy dtype, got {kernel.output_dtype!r}")
    elif kernel.max_output_bytes % dtype.itemsize:
        _fail(
            kernel,
            "max_output_bytes",
            f"{kernel.max_output_bytes} is not a whole number of {dtype.name} items",
        )


def _check_signature(kernel: CudaShape) -> None:
    if kernel.ptx:
        params = ptx_params(kernel.ptx, kernel.entry)
    else:
        params = source_params(kernel.source, kernel.entry)
    if params is None:
        return
    if len(params) != len(kernel.args):
        _fail(
            kernel,
            "args",
            f"{kernel.entry} takes {len(params)} parameters, args has {len(kernel.args)}",
        )
    for i, (arg, param) in enumerate(zip(kernel.args, params, strict=True)):
        kind = arg if isinstance(arg, str) else arg[0]
        wrong_kind = param.pointer is not None and param.pointer != (kind in ("in", "out"))
        wrong_size = param.size is not None and param.size != _ARG_BYTES[kind]
        if wrong_kind or wrong_size or _wrong_scalar(arg, param.kind):
            _fail(kernel, f"args[{i}]", f"{arg!r} does not fit `{param.text}` of {kernel.entry}")


def _wrong_scalar(arg: ArgSpec, c_kind: str | None) -> bool:
    """Whether a scalar cannot be the parameter's value.

    A float for an integer or the reverse (its bits would be read as the other kind), or an
    integer outside the parameter's range.
    """
    if c_kind is None:
        return False
    kind, value = ("u64", 0) if arg == IN_BYTES else arg if isinstance(arg, tuple) else ("", 0)
    if not kind:
        return False
    if (kind[0] == "f") != (c_kind == "f"):
        return True
    if c_kind == "f" or kind[0] == c_kind:
        return False
    bits = _ARG_BYTES[kind] * 8
    low, high = (0, 2**bits - 1) if c_kind == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return not low <= int(value) <= high
