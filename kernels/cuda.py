"""CudaKernel: a user's CUDA C++ or PTX kernel in the GPU_SUBMIT shape, bytes in and bytes out.

A CudaKernel is the source (or PTX), the entry point, a fixed grid and block, typed args and
a maximum output size. It travels to workers as a blob (`to_blob`/`from_blob`; the kernels
object store keys it by `digest`). GPU workers compile it once per process and device
through a `ModuleCache`; simulated GPUs run its optional NumPy `reference` instead.

Args are "in" (the chunk's bytes on the device), "out" (a zeroed buffer of
`max_output_bytes`, returned whole), "in_bytes" (the chunk's length as a u64) and typed
scalars such as ("f32", 2.0). `from_blob` never runs code: the reference is unpickled on its
first call, so only workers that allow code ever unpickle it.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, NoReturn, TypeAlias

import attrs
import cloudpickle
import msgpack
import numpy as np

from .code import dumps_by_value, python_version
from .kernel import KernelArgumentError

# reference(xp, data) -> output bytes; `xp` is numpy on a simulated GPU.
Reference: TypeAlias = Callable[[ModuleType, bytes], bytes]
# "in" | "out" | "in_bytes" | (scalar type, value), e.g. ("f32", 2.0).
ArgSpec: TypeAlias = str | tuple[str, int | float]

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
_BLOB_KIND = "cuda"
_REQUIRED = ("name", "entry", "grid", "block", "args", "max_output_bytes")
_OPTIONAL = ("source", "ptx", "max_input_bytes", "output_dtype", "shared_mem_bytes")
# Driver statuses of a launch the driver refused (a bad shape or too many resources): the
# context stays usable. INVALID_VALUE, LAUNCH_OUT_OF_RESOURCES.
_LAUNCH_REFUSED = frozenset({1, 701})
# Statuses of a module that did not load: INVALID_IMAGE, NO_BINARY_FOR_GPU, INVALID_PTX,
# JIT_COMPILER_NOT_FOUND, UNSUPPORTED_PTX_VERSION, INVALID_SOURCE, NOT_FOUND (no such entry).
_LOAD_FAILED = frozenset({200, 209, 218, 221, 222, 300, 500})
_MAX_DYNAMIC_SHARED_ATTRIBUTE = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_DEFAULT_SHARED_LIMIT = 48 * 1024  # above this a kernel must opt in to dynamic shared memory


class KernelCompileError(Exception):
    """The kernel did not compile or load; `log` holds the compiler's (or driver's) output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log

    def __reduce__(self) -> tuple[type[KernelCompileError], tuple[str, str]]:
        # Executors may pickle errors across processes: keep the log.
        return (type(self), (str(self), self.log))


class NoReference(Exception):
    """A simulated GPU was asked to run a CudaKernel that has no NumPy reference."""


def _dim3(value: Any) -> Any:
    """Lists become tuples and 1-2 dims are padded with 1; the validator reports the rest."""
    if isinstance(value, list | tuple) and 1 <= len(value) <= 3:
        return (*value, 1, 1)[:3]
    return value


def _arg_specs(value: Any) -> Any:
    """Lists (as msgpack and TOML give them) become tuples; the validator reports the rest."""
    if isinstance(value, list | tuple):
        return tuple(tuple(a) if isinstance(a, list) else a for a in value)
    return value


def _text_repr(text: str) -> str:
    return f"<{len(text)} chars>" if text else "''"


@attrs.frozen
class PickledReference:
    """A reference as the blob carries it: unpickled on its first call, never in `from_blob`."""

    pickled: bytes = attrs.field(repr=False)
    python: str
    _loaded: list[Reference] = attrs.field(init=False, factory=list, eq=False, repr=False)

    def __call__(self, xp: ModuleType, data: bytes) -> bytes:
        """Unpickle (once) and call the reference."""
        return self.load("reference")(xp, data)

    def load(self, name: str) -> Reference:
        """The unpickled function (this runs the sender's code).

        Raises:
            KernelArgumentError: it was pickled on another Python version.
            KernelCompileError: it did not unpickle (a module missing on this worker, say).
        """
        if not self._loaded:
            here = python_version()
            if self.python != here:
                raise KernelArgumentError(
                    f"{name}: the reference was pickled on Python {self.python}; "
                    f"this worker runs Python {here}"
                )
            try:
                fn = cloudpickle.loads(self.pickled)
            except Exception as exc:  # unpickling runs arbitrary code: any error is "not loaded"
                raise KernelCompileError(
                    f"{name}: the reference did not unpickle", f"{type(exc).__name__}: {exc}"
                ) from None
            if not callable(fn):
                raise KernelCompileError(f"{name}: the reference is a {type(fn).__name__}")
            # Two threads may both unpickle the first time; either result is the same function.
            self._loaded.append(fn)
        return self._loaded[0]


@attrs.frozen
class CudaKernel:
    """A user's CUDA kernel: source or PTX, entry, launch shape, typed args and output size.

    Exactly one of `source` (CUDA C++, compiled with NVRTC) and `ptx` is set. The output is
    always `max_output_bytes` long, on a GPU and from the reference alike. Grid and block
    take 1 to 3 dims (padded with 1). Kernels are the same kernel when their `digest`s are.
    """

    name: str
    entry: str
    grid: tuple[int, int, int] = attrs.field(converter=_dim3)
    block: tuple[int, int, int] = attrs.field(converter=_dim3)
    args: tuple[ArgSpec, ...] = attrs.field(converter=_arg_specs)
    max_output_bytes: int
    source: str = attrs.field(default="", repr=_text_repr)
    ptx: str = attrs.field(default="", repr=_text_repr)
    max_input_bytes: int = 1_000_000
    output_dtype: str = "float32"
    shared_mem_bytes: int = 0
    reference: Reference | None = None
    _blob: list[bytes] = attrs.field(init=False, factory=list, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        _validate(self)

    @property
    def digest(self) -> str:
        """sha256 of the blob: what a JobSpec pins and the kernels store is keyed by."""
        return hashlib.sha256(self.to_blob()).hexdigest()

    def to_blob(self) -> bytes:
        """msgpack of the fields; the reference is pickled by value, so workers need no import.

        Raises:
            TypeError: the reference cannot be pickled.
        """
        if not self._blob:
            body: dict[str, Any] = {"kind": _BLOB_KIND}
            body |= {key: getattr(self, key) for key in (*_REQUIRED, *_OPTIONAL)}
            if isinstance(self.reference, PickledReference):
                body |= {"reference": self.reference.pickled, "python": self.reference.python}
            elif self.reference is not None:
                body |= {"reference": dumps_by_value(self.reference), "python": python_version()}
            # Cached: a second pickling could differ in bytes, and the digest must not.
            self._blob.append(msgpack.packb(body, use_bin_type=True))
        return self._blob[0]

    @classmethod
    def from_blob(cls, blob: bytes) -> CudaKernel:
        """Parse a blob without running any of its code (the reference stays pickled).

        Raises:
            KernelArgumentError: not a CudaKernel blob, or a field is invalid.
        """
        body = _unpack(blob)
        missing = [key for key in _REQUIRED if key not in body]
        if missing:
            raise KernelArgumentError(f"CudaKernel blob lacks {', '.join(missing)}")
        fields = {key: body[key] for key in (*_REQUIRED, *_OPTIONAL) if key in body}
        pickled, python = body.get("reference"), body.get("python")
        if pickled is not None:
            if not isinstance(pickled, bytes) or not isinstance(python, str):
                raise KernelArgumentError("CudaKernel blob: reference needs bytes and a python")
            fields["reference"] = PickledReference(pickled, python)
        kernel = cls(**fields)
        # The digest is that of the blob as shipped, whoever encoded it.
        kernel._blob.append(bytes(blob))
        return kernel

    def run_reference(self, xp: ModuleType, data: bytes) -> bytes:
        """Run the reference (a simulated GPU); the output is zero-padded to max_output_bytes.

        Raises:
            NoReference: the kernel has no reference.
            KernelArgumentError: the input or output breaks a limit, the reference raised
                ValueError, or it was pickled on another Python version.
            KernelCompileError: the pickled reference did not unpickle.
        """
        fn = self._reference_function()
        self._check_input(data)
        try:
            out = _as_bytes(fn(xp, data))
        except ValueError as exc:
            raise KernelArgumentError(f"{self.name}: {exc}") from None
        if len(out) > self.max_output_bytes:
            raise KernelArgumentError(
                f"{self.name}: output of {len(out)} bytes exceeds "
                f"max_output_bytes={self.max_output_bytes}"
            )
        # Padded like the GPU's zeroed `out` buffer, so both give the same bytes.
        return out.ljust(self.max_output_bytes, b"\0")

    def launch(self, cupy: ModuleType, data: bytes, modules: ModuleCache) -> bytes:
        """Run on the current device and stream, then return the whole `out` buffer.

        Other CUDA errors than those below propagate: they may have poisoned the context.

        Raises:
            KernelCompileError: the kernel did not compile or load, or has no such entry.
            KernelArgumentError: the input is too large, or the driver refused the launch.
        """
        self._check_input(data)
        function = modules.function(self)
        out = cupy.zeros(self.max_output_bytes, dtype=cupy.uint8)
        args = self._device_args(cupy, data, out)
        try:
            function(self.grid, self.block, args, shared_mem=self.shared_mem_bytes)
        except cupy.cuda.driver.CUDADriverError as exc:
            if exc.status not in _LAUNCH_REFUSED:
                raise
            raise KernelArgumentError(
                f"{self.name}: the driver refused grid={self.grid} block={self.block} "
                f"shared_mem_bytes={self.shared_mem_bytes}: {exc}"
            ) from None
        cupy.cuda.get_current_stream().synchronize()
        return bytes(out.get().tobytes())

    def _device_args(self, cupy: ModuleType, data: bytes, out: Any) -> tuple[Any, ...]:
        # An empty chunk still gets a real (1-byte) buffer: never a null pointer.
        inp = (
            cupy.asarray(np.frombuffer(data or b"\0", dtype=np.uint8))
            if "in" in self.args
            else None
        )
        named = {"in": inp, "out": out, IN_BYTES: np.uint64(len(data))}
        return tuple(
            named[a] if isinstance(a, str) else SCALAR_TYPES[a[0]](a[1]) for a in self.args
        )

    def _check_input(self, data: bytes) -> None:
        if len(data) > self.max_input_bytes:
            raise KernelArgumentError(
                f"{self.name}: input of {len(data)} bytes exceeds "
                f"max_input_bytes={self.max_input_bytes}"
            )

    def _reference_function(self) -> Reference:
        if self.reference is None:
            raise NoReference(
                f"kernel {self.name!r} has no xp reference; this worker simulates its GPUs and "
                "cannot run CUDA: run it on a GPU worker or give the kernel a reference"
            )
        if isinstance(self.reference, PickledReference):
            return self.reference.load(self.name)
        return self.reference


@attrs.define
class ModuleCache:
    """Loaded kernel functions by (digest, device) for one process, shared by its threads.

    `cupy` defaults to the installed CuPy, imported on first use.
    """

    cupy: ModuleType | None = None
    _entries: dict[tuple[str, int], Any] = attrs.field(init=False, factory=dict)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def function(self, kernel: CudaKernel) -> Any:
        """The kernel's launchable function on the current device, compiled on first use.

        Raises:
            KernelCompileError: it did not compile or load, or has no such entry; the failure
                is remembered, so a bad kernel is not compiled again for every chunk.
            KernelArgumentError: the GPU cannot give it `shared_mem_bytes`.
        """
        cupy = self.cupy if self.cupy is not None else _import_cupy()
        key = (kernel.digest, int(cupy.cuda.runtime.getDevice()))
        # One lock for every kernel: threads starting the same new kernel wait for one
        # compile instead of each running NVRTC.
        with self._lock:
            if key not in self._entries:
                try:
                    self._entries[key] = _load(cupy, kernel)
                except KernelCompileError as exc:
                    self._entries[key] = exc
            entry = self._entries[key]
        if isinstance(entry, KernelCompileError):
            raise KernelCompileError(str(entry), entry.log)
        return entry


def _import_cupy() -> ModuleType:
    import cupy

    return cupy  # type: ignore[no-any-return]


def _load(cupy: Any, kernel: CudaKernel) -> Any:
    """Compile (source) or load (PTX) the module, look up the entry, allow its shared memory."""
    try:
        if kernel.source:
            function = cupy.RawModule(code=kernel.source).get_function(kernel.entry)
            handle = function.kernel.ptr
        else:
            # CuPy 13's RawModule takes PTX only as a file path; Module.load is the
            # cuModuleLoadData that CuPy itself uses for NVRTC's PTX, and needs no temp file.
            module = cupy.cuda.function.Module()
            module.load(kernel.ptx.encode())
            function = module.get_function(kernel.entry)
            handle = function.ptr
    except cupy.cuda.compiler.CompileException as exc:
        raise KernelCompileError(f"{kernel.name}: NVRTC could not compile it", str(exc)) from None
    except cupy.cuda.driver.CUDADriverError as exc:
        if exc.status not in _LOAD_FAILED:
            raise
        raise KernelCompileError(_load_failure(kernel, exc.status), str(exc)) from None
    if kernel.shared_mem_bytes > _DEFAULT_SHARED_LIMIT:
        try:
            cupy.cuda.driver.funcSetAttribute(
                handle, _MAX_DYNAMIC_SHARED_ATTRIBUTE, kernel.shared_mem_bytes
            )
        except cupy.cuda.driver.CUDADriverError as exc:
            if exc.status not in _LAUNCH_REFUSED:
                raise
            raise KernelArgumentError(
                f"{kernel.name}: shared_mem_bytes={kernel.shared_mem_bytes} is more than this "
                f"GPU allows: {exc}"
            ) from None
    return function


def _load_failure(kernel: CudaKernel, status: int) -> str:
    if status == 500:  # CUDA_ERROR_NOT_FOUND from cuModuleGetFunction
        return (
            f"{kernel.name}: no entry {kernel.entry!r} in the module (a C++ kernel needs "
            'extern "C", or give its mangled name)'
        )
    return f"{kernel.name}: the {'PTX' if kernel.ptx else 'compiled module'} did not load"


def _unpack(blob: bytes) -> dict[str, Any]:
    try:
        body = msgpack.unpackb(blob, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise KernelArgumentError(f"not a CudaKernel blob: {exc}") from None
    if not isinstance(body, dict) or body.get("kind") != _BLOB_KIND:
        kind = body.get("kind") if isinstance(body, dict) else type(body).__name__
        raise KernelArgumentError(f"not a CudaKernel blob (kind {kind!r}, expected 'cuda')")
    return body


def _as_bytes(out: Any) -> bytes:
    if isinstance(out, bytes | bytearray | memoryview):
        return bytes(out)
    if hasattr(out, "tobytes"):  # a NumPy or CuPy array
        return bytes(out.tobytes())
    raise KernelArgumentError(f"the reference returned {type(out).__name__}, not bytes")


# Validation: each check names the field it rejects.


def _fail(kernel: CudaKernel, field: str, detail: str) -> NoReturn:
    raise KernelArgumentError(f"CudaKernel {kernel.name!r}: {field}: {detail}")


def _validate(kernel: CudaKernel) -> None:
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


def _check_dims(kernel: CudaKernel, field: str, dims: Any, limits: tuple[int, ...]) -> None:
    ints = isinstance(dims, tuple) and len(dims) == 3
    if not ints or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        _fail(kernel, field, f"must be 1 to 3 ints, got {dims!r}")
    for axis, dim, limit in zip("xyz", dims, limits, strict=True):
        if not 1 <= dim <= limit:
            _fail(kernel, field, f"{axis}={dim} outside 1..{limit}")


def _check_args(kernel: CudaKernel) -> None:
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


def _check_sizes(kernel: CudaKernel) -> None:
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


# The entry's parameters, read from its signature, catch args that do not fit before a
# launch reads garbage (or faults and poisons the context). A signature that cannot be
# read with confidence (templates, macros) is not checked.


@attrs.frozen
class _Param:
    """One kernel parameter: pointer or not, and its size, where the text tells."""

    text: str
    pointer: bool | None
    size: int | None


_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_PTX_TYPE = re.compile(r"\.[busf](8|16|32|64)\b")
_PTX_ARRAY = re.compile(r"\[(\d+)\]")
_C_QUALIFIERS = re.compile(r"\b(?:const|volatile|__restrict__|__restrict|restrict)\b")
_C_SIZES = {"float": 4, "double": 8, "int": 4, "unsigned": 4, "unsigned int": 4}
_C_SIZES |= {"int32_t": 4, "uint32_t": 4, "int64_t": 8, "uint64_t": 8, "size_t": 8}
_C_SIZES |= {"long long": 8, "long long int": 8, "unsigned long long": 8}


def _check_signature(kernel: CudaKernel) -> None:
    params = _ptx_params(kernel) if kernel.ptx else _source_params(kernel)
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
        if wrong_kind or (param.size is not None and param.size != _ARG_BYTES[kind]):
            _fail(kernel, f"args[{i}]", f"{arg!r} does not fit `{param.text}` of {kernel.entry}")


def _ptx_params(kernel: CudaKernel) -> list[_Param] | None:
    pattern = r"\.entry\s+" + re.escape(kernel.entry) + r"\s*\(([^)]*)\)"
    match = re.search(pattern, _COMMENTS.sub(" ", kernel.ptx))
    if match is None:
        return None
    params = []
    for text in (t.strip() for t in match.group(1).split(",") if t.strip()):
        bits, count = _PTX_TYPE.search(text), _PTX_ARRAY.search(text)
        size = int(bits.group(1)) // 8 * (int(count.group(1)) if count else 1) if bits else None
        # A PTX pointer is a plain .u64: only the size can be checked.
        params.append(_Param(" ".join(text.split()), None, size))
    return params


def _source_params(kernel: CudaKernel) -> list[_Param] | None:
    pattern = (
        r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
        + re.escape(kernel.entry)
        + r"\s*\(([^()]*)\)"
    )
    found = {" ".join(m.split()) for m in re.findall(pattern, _COMMENTS.sub(" ", kernel.source))}
    # Zero or two different signatures (overloads, #if branches), or template arguments
    # whose commas break the split: leave it to the compiler.
    if len(found) != 1 or "<" in next(iter(found)):
        return None
    body = found.pop()
    if body in ("", "void"):
        return []
    return [_c_param(text.strip()) for text in body.split(",")]


def _c_param(text: str) -> _Param:
    if "*" in text or "[" in text:
        return _Param(text, True, 8)
    words = _C_QUALIFIERS.sub(" ", text).split()
    size = _C_SIZES.get(" ".join(words[:-1]))
    # An unknown type may be a typedef of a pointer: then nothing is checked.
    return _Param(text, False if size else None, size)
