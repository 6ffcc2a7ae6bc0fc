"""Python callables as work: a function pickled by value, run on inputs that are pickled too.

`PythonCode.of(fn)` pickles `fn` with cloudpickle *by value* (its module's code travels
along), so a function defined in a script, a notebook or a test file runs on a worker that
cannot import it. Inputs and outputs are pickled objects; bytes are objects like any other.
A function that names a `ctx` parameter receives a `Context`: the device, the slice size,
the array module and `checkpoint(state)`.

Unpickling runs code: only executor processes of workers started with `--allow-code` call
`from_blob`, never the node agent.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import pickle
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import cloudpickle
import msgpack

from .by_value import dumps_by_value
from .errors import KernelArgumentError

# Outputs of a callable are capped at this by default (large ones travel by object store).
DEFAULT_MAX_OUTPUT_BYTES = 64 * 2**20
# Uploaded work (a pickled callable, CUDA source) at most: a node hands it to an executor in
# one frame (worker/executor/ipc.py, 256 MiB) and refuses a larger blob unread.
MAX_BLOB_BYTES = 255 * 2**20


def python_version() -> str:
    """This interpreter's `major.minor`: a pickled function runs only on the same one."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


@attrs.define
class Context:
    """What a running callable may know and do: its device, slice, array module, checkpoints.

    `device` is the GPU index as the executor process sees it (`None` on a simulated GPU);
    `resumed` is the state of the last `checkpoint()` of an earlier delivery of this chunk,
    or None on a fresh start. `xp` is given as the array module, or as a function that
    imports it when the callable first reads `ctx.xp` (NumPy took a fresh executor's first
    call 0.1 s on a 2-core machine, for a function that never used it).
    """

    device: int | None
    slice_bytes: int
    _xp: types.ModuleType | Callable[[], types.ModuleType] = attrs.field(alias="xp")
    attempt: int
    job: str
    index: int
    resumed: Any = None
    _save: Callable[[bytes], None] | None = None

    @property
    def xp(self) -> types.ModuleType:
        """The slice's array module: CuPy on a GPU, NumPy on a simulated one."""
        if not isinstance(self._xp, types.ModuleType):
            self._xp = self._xp()
        return self._xp

    def checkpoint(self, state: Any) -> None:
        """Store `state` durably; a redelivered chunk gets it back as `ctx.resumed`."""
        if self._save is None:
            raise RuntimeError("checkpoints are not available in this context")
        self._save(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))


@attrs.frozen
class PythonCode:
    """A callable ready to run: its pickled bytes, the Python it needs and its output limit."""

    fn_bytes: bytes
    python: str
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    name: str = "fn"

    @classmethod
    def of(
        cls, fn: Callable[..., Any], max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    ) -> PythonCode:
        """Pickle `fn` by value.

        Raises:
            TypeError: `fn` is not callable or cannot be pickled.
        """
        if not callable(fn):
            raise TypeError(f"work must be a Kernel, a CudaKernel or a callable, got {fn!r}")
        return cls(
            fn_bytes=dumps_by_value(fn),
            python=python_version(),
            max_output_bytes=max_output_bytes,
            name=getattr(fn, "__qualname__", type(fn).__name__),
        )

    @property
    def digest(self) -> str:
        """sha256 of the blob: the object's name in the kernels store."""
        return hashlib.sha256(self.to_blob()).hexdigest()

    def to_blob(self) -> bytes:
        """The bytes uploaded to the kernels object store."""
        body = {
            "kind": "python",
            "name": self.name,
            "python": self.python,
            "max_output_bytes": self.max_output_bytes,
            "fn": self.fn_bytes,
        }
        return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def from_blob(cls, blob: bytes) -> PythonCode:
        """Parse a blob (no code runs yet); KernelArgumentError if it is not one."""
        try:
            body = msgpack.unpackb(blob, raw=False)
            if body.get("kind") != "python":
                raise ValueError(f"kind is {body.get('kind')!r}")
            return cls(
                fn_bytes=bytes(body["fn"]),
                python=str(body["python"]),
                max_output_bytes=int(body["max_output_bytes"]),
                name=str(body.get("name", "fn")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KernelArgumentError(f"not a Python-code blob: {exc}") from None
        except Exception as exc:  # msgpack raises assorted types for garbage
            raise KernelArgumentError(f"not a Python-code blob: {type(exc).__name__}") from None

    def load(self) -> LoadedFunction:
        """Unpickle the function (this runs code from the blob): `run(arg, ctx)` calls it.

        Whether it takes `ctx` is read here, once: inspecting its signature costs more than a
        tiny chunk's work.
        """
        if self.python != python_version():
            raise KernelArgumentError(
                f"the function was pickled on Python {self.python}; this worker runs "
                f"{python_version()}"
            )
        fn = cloudpickle.loads(self.fn_bytes)
        if not callable(fn):
            raise KernelArgumentError(f"the blob holds {type(fn).__name__}, not a callable")
        return LoadedFunction(fn, wants_context(fn))

    def call(self, run: LoadedFunction, data: bytes, ctx: Context | None) -> bytes:
        """Run the loaded function on the unpickled input; the pickled output within the limit."""
        out = run(pickle.loads(data), ctx)
        blob = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        if len(blob) > self.max_output_bytes:
            raise self._too_big(blob)
        return blob

    def call_run(self, run: LoadedFunction, inputs: Sequence[bytes], out: list[bytes]) -> None:
        """Append to `out` what `call` gives for each input from `inputs[len(out)]` on.

        For a function that takes no `ctx`: one loop over a pack's inputs, without the calls
        around each that cost a tiny chunk more than its own work. Raises what `call` would
        at the first input that fails; that input is `inputs[len(out)]`.
        """
        fn, loads, dumps = run.fn, pickle.loads, pickle.dumps
        limit, protocol, append = self.max_output_bytes, pickle.HIGHEST_PROTOCOL, out.append
        for data in itertools.islice(inputs, len(out), None):
            blob = dumps(fn(loads(data)), protocol)
            if len(blob) > limit:
                raise self._too_big(blob)
            append(blob)

    def _too_big(self, blob: bytes) -> KernelArgumentError:
        return KernelArgumentError(
            f"{self.name}: output of {len(blob)} bytes exceeds "
            f"max_output_bytes={self.max_output_bytes}"
        )


@attrs.frozen
class LoadedFunction:
    """An unpickled function, called as `run(arg, ctx)`; `ctx` is passed if it takes one."""

    fn: Callable[..., Any]
    # Read once at load: inspecting a signature costs more than a tiny chunk's work, and a
    # pack of chunks of a function that takes no `ctx` makes none.
    wants_context: bool

    def __call__(self, arg: Any, ctx: Context | None) -> Any:
        """Call the function on one input."""
        return self.fn(arg, ctx=ctx) if self.wants_context else self.fn(arg)


def wants_context(fn: Callable[..., Any]) -> bool:
    """Whether `fn` takes a `ctx` parameter."""
    if type(fn) is types.FunctionType and not hasattr(fn, "__wrapped__"):
        # A plain function's parameters are the first names of its code (positional, then
        # keyword-only, then *args and **kwargs), as `inspect.signature` reads them: it cost
        # an interactive call a tenth of its executor's time. `__signature__` or
        # `__wrapped__` (a decorator's) would change what `inspect.signature` says.
        code = fn.__code__
        if not hasattr(fn, "__signature__"):
            star = bool(code.co_flags & inspect.CO_VARARGS)
            stars = bool(code.co_flags & inspect.CO_VARKEYWORDS)
            n = code.co_argcount + code.co_kwonlyargcount + star + stars
            return "ctx" in code.co_varnames[:n]
    try:
        return "ctx" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


# Values whose pickle is the same from pickle and cloudpickle (checked in test_code.py) ...
_PLAIN = frozenset((int, float, str, bytes, bool, type(None)))
# ... and containers of them (dicts keyed by them), at most this deep and this long each: past
# that, checking would cost more than cloudpickle saves.
_CONTAINERS = frozenset((tuple, list, dict))
_PLAIN_DEPTH, _PLAIN_ITEMS = 3, 256


def encode_inputs(values: Sequence[Any]) -> list[bytes]:
    """Chunk inputs of a callable job, each the bytes `encode_input` makes of it."""
    if set(map(type, values)) <= _PLAIN:
        dumps, protocol = pickle.dumps, pickle.HIGHEST_PROTOCOL
        return [dumps(v, protocol) for v in values]
    return [encode_input(v) for v in values]


def encode_input(value: Any) -> bytes:
    """A chunk input of a callable job: any picklable object, bytes included."""
    if _plain(value, _PLAIN_DEPTH):
        # The same bytes as cloudpickle's, at a seventh of the cost (a chunk id hashes them).
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[no-any-return]


def _plain(value: Any, depth: int) -> bool:
    """Whether `value` is a `_PLAIN` value, or a short container of them `depth` deep."""
    kind = type(value)
    if kind in _PLAIN:
        return True
    if not depth or kind not in _CONTAINERS or len(value) > _PLAIN_ITEMS:
        return False
    if kind is dict:
        if not set(map(type, value)) <= _PLAIN:
            return False
        value = value.values()
    kinds = set(map(type, value))
    if kinds <= _PLAIN:
        return True
    return kinds <= _PLAIN | _CONTAINERS and all(_plain(v, depth - 1) for v in value)
