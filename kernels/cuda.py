"""CudaKernel: a user's CUDA C++ or PTX kernel in the GPU_SUBMIT shape, bytes in and bytes out.

A CudaKernel is the source (or PTX), the entry point, a fixed grid and block, typed args and
a maximum output size. It travels to workers as a blob (`to_blob`/`from_blob`; the kernels
object store keys it by `digest`). GPU workers compile it once per process and device
through a `ModuleCache` (cuda_compile.py); simulated GPUs run its optional NumPy
`reference` instead. Its fields are checked on construction (cuda_checks.py).

Args are "in" (the chunk's bytes on the device), "out" (a zeroed buffer of
`max_output_bytes`, returned whole), "in_bytes" (the chunk's length as a u64) and typed
scalars such as ("f32", 2.0). `from_blob` never runs code: the reference is unpickled on its
first call, so only workers that allow code ever unpickle it.
"""

from __future__ import annotations

import hashlib
import threading
from types import ModuleType
from typing import Any

import attrs
import msgpack
import numpy as np

from .by_value import dumps_by_value
from .code import python_version
from .cuda_checks import IN_BYTES, SCALAR_TYPES, arg_specs, dim3, validate
from .cuda_compile import LAUNCH_REFUSED, ModuleCache
from .cuda_precheck import precheck
from .cuda_reference import PickledReference, Reference
from .cuda_shape import ArgSpec
from .errors import KernelArgumentError, KernelCompileError, NoReference
from .host import HostLibrary, launcher, run_host
from .host_build import HostUnsupported
from .host_check import check_chunk
from .nvrtc import CudaSourceError
from .settings import CudaSettings

__all__ = [
    "ArgSpec",
    "CudaKernel",
    "CudaSourceError",
    "HostUnsupported",
    "KernelCompileError",
    "ModuleCache",
    "NoReference",
    "PickledReference",
    "Reference",
]

_BLOB_KIND = "cuda"
# Taken by the first chunk of a kernel in a process: its others wait for one launcher, rather
# than each scanning, hashing and looking up 600 KB of source (125 threads of a demo process).
_host_lock = threading.Lock()
_REQUIRED = ("name", "entry", "grid", "block", "args", "max_output_bytes")
_OPTIONAL = ("source", "ptx", "max_input_bytes", "output_dtype", "shared_mem_bytes")


def _text_repr(text: str) -> str:
    return f"<{len(text)} chars>" if text else "''"


@attrs.frozen
class CudaKernel:
    """A user's CUDA kernel: source or PTX, entry, launch shape, typed args and output size.

    Exactly one of `source` (CUDA C++, compiled with NVRTC) and `ptx` is set. The output is
    always `max_output_bytes` long, on a GPU and from the reference alike. Grid and block
    take 1 to 3 dims (padded with 1). Kernels are the same kernel when their `digest`s are.
    """

    name: str
    entry: str
    grid: tuple[int, int, int] = attrs.field(converter=dim3)
    block: tuple[int, int, int] = attrs.field(converter=dim3)
    args: tuple[ArgSpec, ...] = attrs.field(converter=arg_specs)
    max_output_bytes: int
    source: str = attrs.field(default="", repr=_text_repr)
    ptx: str = attrs.field(default="", repr=_text_repr)
    max_input_bytes: int = 1_000_000
    output_dtype: str = "float32"
    shared_mem_bytes: int = 0
    reference: Reference | None = None
    _blob: list[bytes] = attrs.field(init=False, factory=list, eq=False, repr=False)
    _host: list[Any] = attrs.field(init=False, factory=list, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        validate(self)
        if self.source:
            # Here rather than at submission: whoever builds the kernel (a Job, a JOB.toml)
            # learns of a compile error before any lease or chunk (cuda_precheck.py).
            settings = CudaSettings.from_env()
            if settings.check:
                precheck(self, settings)

    @property
    def digest(self) -> str:
        """sha256 of the blob: what a JobSpec pins and the kernels store is keyed by."""
        return hashlib.sha256(self.to_blob()).hexdigest()

    def to_blob(self) -> bytes:
        """The fields as msgpack; the reference is pickled by value, so workers need no import.

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

    def run_host(self, data: bytes, builtin: bool = False) -> bytes:
        """Run the CUDA source on the CPU (host.py); a PTX kernel runs its reference instead.

        `builtin`: the node's own code (a registered kernel's CUDA version), whose library
        may be built in the node's built-ins folder.

        Raises:
            HostUnsupported: the source uses a CUDA feature the host path lacks.
            KernelCompileError: it did not build for the host (g++ missing, or an error).
            KernelArgumentError: the input is too large.
            NoReference: a PTX kernel without a reference.
        """
        if not self.source:
            return self.run_reference(np, data)
        if not self._host:
            # Built once per kernel object: scanning and hashing the source per chunk is slow,
            # and a build that failed fails every later chunk at once.
            with _host_lock:
                if not self._host:
                    settings = CudaSettings.from_env()
                    try:
                        self._host.append(launcher(self, settings, builtin=builtin))
                    except KernelCompileError as exc:
                        self._host.append(exc)
                    # A user's kernel runs its first chunk (or all) in check mode; the node's
                    # own kernels are checked by CI.
                    self._host.append("off" if builtin else settings.host_check)
        library: HostLibrary | KernelCompileError = self._host[0]
        mode: str = self._host[1]
        if isinstance(library, KernelCompileError):
            raise type(library)(str(library), library.log)
        if mode == "all" or (mode == "first" and self._claim_check()):
            return check_chunk(self, data)
        return run_host(self, data, library)

    def check_host(self, data: bytes) -> bytes:
        """Run one chunk in check mode (host_check.py): its output, if nothing is wrong.

        Raises:
            KernelFault: a race, an uninitialised read, a bad access, a barrier or warp rule
                broken (KernelRace: the output depends on the order threads run in).
            KernelCompileError: the check build failed, or this kernel is PTX.
        """
        if not self.source:
            raise KernelCompileError(f"{self.name}: the host path checks CUDA source, not PTX")
        self._check_input(data)
        return check_chunk(self, data)

    def _claim_check(self) -> bool:
        with _host_lock:
            if len(self._host) > 2:
                return False
            self._host.append("checked")
            return True

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
            if exc.status not in LAUNCH_REFUSED:
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
