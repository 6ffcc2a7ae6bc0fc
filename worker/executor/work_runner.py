"""WorkRunner: runs one chunk's work inside an executor process, on its device, in its slice.

The work is a registered kernel (by name and digest), a Python function or a CUDA kernel
(both from blobs the agent sent once, parsed and loaded once per process). A registered
kernel with a CUDA version runs that: launched on a GPU, on the host path of a simulated
one (its reference when the machine has no g++). On a GPU each lease's chunks run on the
lease's own CUDA stream with a CuPy memory pool capped at its slice (lease_devices.py).
Kernel errors become a `Failure` of the matching kind; anything else the work raises is the
caller's.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
import traceback
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from vramfabric.broker.errors import ErrorKind, SliceVramExceeded
from vramfabric.kernels.code import Context, LoadedFunction, PythonCode
from vramfabric.kernels.cuda_compile import ModuleCache
from vramfabric.kernels.errors import KernelArgumentError, KernelCompileError, NoReference
from vramfabric.kernels.registry import KernelMissing, Registry

if TYPE_CHECKING:
    from vramfabric.kernels.kernel import Kernel

from . import ipc
from .captured import TRACEBACK_CHARS
from .lease_devices import LeaseDevices

log = logging.getLogger(__name__)

_TRACEBACK_FRAMES = 4


class Failure(Exception):
    """A chunk failed with a known kind; the message goes into its result."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class WorkRunner:
    """The work this process can run: the registry, the loaded blobs and the device."""

    def __init__(self, registry: Callable[[], Registry], simulated: bool) -> None:
        """Use NumPy on a simulated GPU, else CuPy on device 0 (the only one visible).

        `registry` makes the registered kernels' registry, on the first chunk of one (their
        modules import NumPy and the CUDA kernels: see `xp`).
        """
        self._make_registry = registry
        self._registry: Registry | None = None
        self.gpu: int | None = None if simulated else 0
        self._xp: types.ModuleType | None = None
        self.devices: LeaseDevices | None = None
        if not simulated:
            import cupy

            self._xp = cupy
            self.devices = LeaseDevices(cupy)
        self.modules = ModuleCache()
        # False once the host path found no g++: registered kernels then run their reference.
        self._host_path = True
        self._blobs: dict[str, bytes] = {}
        self._loaded: dict[str, Any] = {}
        self._load_lock = threading.Lock()

    @property
    def registry(self) -> Registry:
        """The registered kernels, made on first use."""
        with self._load_lock:
            if self._registry is None:
                self._registry = self._make_registry()
            return self._registry

    @property
    def xp(self) -> types.ModuleType:
        """The array module (`array_module`)."""
        return self.array_module()

    def array_module(self) -> types.ModuleType:
        """The array module: CuPy on a GPU; NumPy on a simulated one, imported on first use.

        An executor whose work never reads `ctx.xp` never imports NumPy (or the CUDA
        kernels' modules): a start took 0.4 s here, most of it those imports, and a fresh
        node's first call waited for it. A Context is given this method, not the module.
        """
        if self._xp is None:
            self._xp = importlib.import_module("numpy")
        return self._xp

    def add_blob(self, digest: str, blob: bytes) -> None:
        """Keep an uploaded work's blob for the chunks that will name it."""
        self._blobs[digest] = blob

    def execute(self, frame: ipc.Run, ctx: Context | None) -> bytes:
        """Run one `run` frame's work (`ctx`: for work that reads one); Failure for a known kind."""
        return self.bind(frame)(bytes(frame.input or b""), ctx)

    def bind(self, frame: ipc.Run) -> Callable[[bytes, Context | None], bytes]:
        """The frame's work as a function of one input, resolved once: a pack's chunks share it.

        Resolving it (a Python function unpickled once per process) and each run raise Failure
        for a known kind of failure. Per chunk, resolving it again was most of what a packed
        tiny chunk cost here beside its own work.
        """
        slice_bytes = frame.slice_bytes
        run = _failing_as(slice_bytes, self._resolve, frame.kind, frame, slice_bytes)
        if self.gpu is not None:
            run = functools.partial(self._on_gpu, frame.lease, slice_bytes, run)
        return lambda data, ctx: _failing_as(slice_bytes, run, data, ctx)

    def bind_run(self, frame: ipc.Run) -> Callable[[Sequence[bytes], list[bytes]], None] | None:
        """The frame's work over a pack's inputs in one loop, where it has one; else None.

        A Python function that takes no `ctx`, on a simulated GPU: `run(inputs, out)` appends
        each input's output to `out` from `inputs[len(out)]` on, raising Failure (a kind) or
        the work's exception at the first that fails (`PythonCode.call_run`). On a GPU each
        chunk runs in its lease's stream (`bind`).

        Raises Failure if its work cannot be had (as `bind` does).
        """
        if frame.kind != "python" or self.gpu is not None:
            return None
        slice_bytes = frame.slice_bytes
        code, fn = _failing_as(slice_bytes, self._load, frame.digest, PythonCode.from_blob, "load")
        if fn.wants_context:
            return None
        return lambda inputs, out: _failing_as(slice_bytes, code.call_run, fn, inputs, out)

    def wants_context(self, frame: ipc.Run) -> bool:
        """Whether the frame's work reads a Context (a function with a `ctx` parameter).

        Raises Failure if its work cannot be had (as `bind` does).
        """
        if frame.kind != "python":
            return False
        loaded: LoadedFunction = self._load(frame.digest, PythonCode.from_blob, "load")[1]
        return loaded.wants_context

    def end_lease(self, lease_id: str) -> None:
        """The agent says the lease ended: free its stream and pool (after its running chunk)."""
        if self.devices is not None:
            self.devices.end(lease_id)

    def _on_gpu(
        self,
        lease: str,
        slice_bytes: int,
        run: Callable[[bytes, Context | None], bytes],
        data: bytes,
        ctx: Context | None,
    ) -> bytes:
        cupy = self.xp
        assert self.devices is not None
        # The lease's stream and pool are made on device 0 (the only one this process sees);
        # using_allocator and the current stream are per thread: this chunk's alone.
        with (
            cupy.cuda.Device(0),
            self.devices.using(lease, slice_bytes) as device,
            device.stream,
            cupy.cuda.using_allocator(device.pool.malloc),
        ):
            out = run(data, ctx)
            device.stream.synchronize()
            return out

    def _resolve(
        self, kind: str, frame: ipc.Run, slice_bytes: int
    ) -> Callable[[bytes, Context | None], bytes]:
        if kind == "builtin":
            return lambda data, _ctx: self._builtin(frame, data, slice_bytes)
        if kind == "python":
            code, fn = self._load(frame.digest, PythonCode.from_blob, "load")
            return functools.partial(code.call, fn)
        if kind == "cuda":
            return lambda data, _ctx: self._cuda(frame, data, slice_bytes)
        raise Failure(ErrorKind.INVALID_MESSAGE, f"unknown kernel kind {kind!r}")

    def _builtin(self, frame: ipc.Run, data: bytes, slice_bytes: int) -> bytes:
        from vramfabric.kernels.host_build import NoHostCompiler  # with the kernels' modules

        kernel: Kernel = self.registry.get_kernel(frame.name, frame.digest)
        need = kernel.vram_bytes(len(data))
        if self.gpu is None and need > slice_bytes:
            # NumPy has no pool to cap: check the kernel's declared working set up front.
            raise Failure(ErrorKind.VRAM_EXCEEDED, str(SliceVramExceeded(slice_bytes, need)))
        if kernel.cuda is None or not self._host_path:
            return kernel.run(self.xp, frame.args, data)
        kernel.check_input(data)
        with self._load_lock:  # one build per process, not one per thread of a burst
            cuda = kernel.cuda()
        if self.gpu is not None:
            return cuda.launch(self.xp, data, self.modules)
        try:
            return cuda.run_host(data, builtin=True)
        except NoHostCompiler as exc:
            self._host_path = False
            log.warning("registered kernels run their NumPy reference here: %s", exc)
            return kernel.run(self.xp, frame.args, data)

    def _cuda(self, frame: ipc.Run, data: bytes, slice_bytes: int) -> bytes:
        from vramfabric.kernels.cuda import CudaKernel  # NumPy and the host path: first use

        kernel, _ = self._load(frame.digest, CudaKernel.from_blob, None)
        if self.gpu is not None:
            return kernel.launch(self.xp, data, self.modules)  # type: ignore[no-any-return]
        need = len(data) + kernel.max_output_bytes
        if need > slice_bytes:
            raise Failure(ErrorKind.VRAM_EXCEEDED, str(SliceVramExceeded(slice_bytes, need)))
        # No GPU: the kernel's own CUDA source, compiled for the host (kernels/host.py).
        return kernel.run_host(data)  # type: ignore[no-any-return]

    def _load(self, digest: str, parse: Callable[[bytes], Any], method: str | None) -> Any:
        """The parsed blob (and, for callables, the unpickled function), once per process."""
        with self._load_lock:
            if digest not in self._loaded:
                blob = self._blobs.get(digest)
                if blob is None:
                    raise Failure(ErrorKind.LOAD_FAILED, f"blob {digest[:12]} was never loaded")
                parsed = parse(blob)
                self._loaded[digest] = (parsed, getattr(parsed, method)() if method else None)
            return self._loaded[digest]


def _failing_as(slice_bytes: int, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, a kernel's error raised as the chunk's Failure of its kind."""
    try:
        return fn(*args)
    except KernelMissing as exc:
        raise Failure(ErrorKind.KERNEL_NOT_FOUND, str(exc.args[0])) from None
    except KernelCompileError as exc:
        raise Failure(ErrorKind.LOAD_FAILED, f"{exc}\n{exc.log}".strip()) from None
    except NoReference as exc:
        raise Failure(ErrorKind.LOAD_FAILED, str(exc)) from None
    except KernelArgumentError as exc:
        raise Failure(ErrorKind.LAUNCH_FAILED, str(exc)) from None
    except MemoryError as exc:
        # CuPy's OutOfMemoryError (a MemoryError) knows the size it was asked for.
        exceeded = SliceVramExceeded(slice_bytes, getattr(exc, "_size", 0))
        raise Failure(exceeded.kind, f"{exceeded} ({exc})" if str(exc) else str(exceeded)) from None


def summary(exc: BaseException) -> str:
    """The exception and the last frames of its traceback (the user's code, usually)."""
    tb = traceback.format_exception(exc, limit=-_TRACEBACK_FRAMES)
    return "".join(tb).strip()[-2000:]


def full_traceback(exc: BaseException) -> str:
    """The exception's whole traceback, as Python prints it (its end, where it is long)."""
    return "".join(traceback.format_exception(exc)).strip()[-TRACEBACK_CHARS:]


def is_cuda_error(exc: BaseException) -> bool:
    """Whether CuPy raised it for a CUDA error (the context may be poisoned)."""
    module = type(exc).__module__ or ""
    return module.startswith("cupy_backends.cuda") or module.startswith("cupy.cuda")
