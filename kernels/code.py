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

import contextlib
import functools
import hashlib
import inspect
import pickle
import sys
import sysconfig
import types
import zlib
from collections.abc import Callable
from typing import Any

import attrs
import cloudpickle
import msgpack

from .kernel import KernelArgumentError

# Outputs of a callable are capped at this by default (large ones travel by object store).
DEFAULT_MAX_OUTPUT_BYTES = 64 * 2**20


# Code under these folders is installed on workers too: pickled by reference.
_INSTALLED = tuple(
    sorted({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
)


def python_version() -> str:
    """This interpreter's `major.minor`: a pickled function runs only on the same one."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


@attrs.define
class Context:
    """What a running callable may know and do: its device, slice, array module, checkpoints.

    `device` is the GPU index as the executor process sees it (`None` on a simulated GPU);
    `resumed` is the state of the last `checkpoint()` of an earlier delivery of this chunk,
    or None on a fresh start.
    """

    device: int | None
    slice_bytes: int
    xp: types.ModuleType
    attempt: int
    job: str
    index: int
    resumed: Any = None
    _save: Callable[[bytes], None] | None = None

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

    def load(self) -> Callable[[Any, Context], Any]:
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
        if wants_context(fn):
            return lambda arg, ctx: fn(arg, ctx=ctx)
        return lambda arg, _ctx: fn(arg)

    def call(self, run: Callable[[Any, Context], Any], data: bytes, ctx: Context) -> bytes:
        """Run the loaded function on the unpickled input; the pickled output within the limit."""
        out = run(pickle.loads(data), ctx)
        blob = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        if len(blob) > self.max_output_bytes:
            raise KernelArgumentError(
                f"{self.name}: output of {len(blob)} bytes exceeds "
                f"max_output_bytes={self.max_output_bytes}"
            )
        return blob


def wants_context(fn: Callable[..., Any]) -> bool:
    """Whether `fn` takes a `ctx` parameter."""
    try:
        return "ctx" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


# Values whose pickle is the same from pickle and cloudpickle (checked in test_code.py).
_PLAIN = frozenset((int, float, str, bytes, bool, type(None)))


def encode_input(value: Any) -> bytes:
    """A chunk input of a callable job: any picklable object, bytes included."""
    kind = type(value)
    if kind in _PLAIN or (kind is tuple and all(type(v) in _PLAIN for v in value)):
        # The same bytes as cloudpickle's, at a seventh of the cost (a chunk id hashes them).
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[no-any-return]


def dumps_by_value(obj: Any) -> bytes:
    """Pickle `obj` with cloudpickle, the module it comes from pickled by value, not by reference.

    The module is registered only for this call: a worker needs neither the module nor the
    file it lives in. `__main__` (scripts, notebooks) is by value already; installed packages
    and the standard library stay by reference (workers have them, and they are large).
    """
    module_name = getattr(obj, "__module__", None) or ""
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None) or ""
    by_value = (
        module is not None
        and module_name not in ("__main__", "builtins")
        and bool(path)
        and not path.startswith(_INSTALLED)
        and module_name not in cloudpickle.list_registry_pickle_by_value()
    )
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        located = _Located(obj, _code_files(obj))
        return cloudpickle.dumps(located, protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[no-any-return]
    except Exception as exc:  # pickling fails in many ways (locks, sockets, C objects)
        raise TypeError(f"cannot pickle {obj!r}: {type(exc).__name__}: {exc}") from None
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


# What cloudpickle (3.1.3 and later) names the file of code it pickles by value.
_DYNAMIC_FILE = "<dynamic-code>"
# A pickled function's reachable functions are walked up to this many (a guard, not a need).
_MAX_FUNCTIONS = 1000

# A function's code by qualified name, first line and a checksum of its bytecode (two cells
# of a notebook may each hold a lambda on their first line).
_CodeKey = tuple[str, int, int]


@attrs.frozen
class _Located:
    """An object to pickle, with the files its functions were defined in.

    cloudpickle 3.1.3 ships by-value code as from "<dynamic-code>", which would leave a
    remote traceback without the user's file name and source lines; unpickling restores them.
    """

    obj: Any
    files: dict[_CodeKey, str]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_relocated, (self.obj, self.files))


def _relocated(obj: Any, files: dict[_CodeKey, str]) -> Any:
    """`obj` unpickled, its functions' code named after the files they came from."""
    for fn in _functions(obj):
        code = fn.__code__
        filename = files.get(_key(code))
        if code.co_filename == _DYNAMIC_FILE and filename:
            fn.__code__ = _refiled(code, filename)
    return obj


def _code_files(obj: Any) -> dict[_CodeKey, str]:
    """Each function reachable from `obj` (by `_key`): the file it was defined in."""
    return {_key(fn.__code__): fn.__code__.co_filename for fn in _functions(obj)}


def _key(code: types.CodeType) -> _CodeKey:
    return (code.co_qualname, code.co_firstlineno, zlib.crc32(code.co_code))


def _refiled(code: types.CodeType, filename: str) -> types.CodeType:
    """`code` and the code nested in it (lambdas, inner functions) named after `filename`."""
    consts = tuple(
        _refiled(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=consts)


def _functions(obj: Any) -> list[types.FunctionType]:
    """The user's functions `obj` reaches, and the functions and classes they name.

    Itself, its closures, the globals its code names, the methods of the user's classes among
    them (and of a callable object's class). Installed code (the standard library, packages)
    is pickled by reference and not walked.
    """
    found: dict[int, types.FunctionType] = {}
    classes: set[int] = set()
    todo = [obj]
    while todo and len(found) < _MAX_FUNCTIONS:
        item = todo.pop()
        if isinstance(item, functools.partial):
            todo.append(item.func)
        elif isinstance(item, (types.MethodType, staticmethod, classmethod)):
            todo.append(item.__func__)
        elif isinstance(item, type):
            if id(item) not in classes and _users(item):
                classes.add(id(item))
                todo.extend(vars(item).values())
        elif isinstance(item, types.FunctionType):
            code = item.__code__
            if id(item) in found or code.co_filename.startswith(_INSTALLED):
                continue
            found[id(item)] = item
            todo.extend(_closure_values(item))
            names = _global_names(code)
            todo.extend(value for name, value in item.__globals__.items() if name in names)
        elif callable(item):
            todo.append(type(item))
    return list(found.values())


def _users(cls: type) -> bool:
    """Whether `cls` is the user's (not built in, nor from an installed module)."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None) or ""
    return cls.__module__ != "builtins" and not path.startswith(_INSTALLED)


def _global_names(code: types.CodeType) -> set[str]:
    """The global names `code` and the code nested in it may read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _closure_values(fn: types.FunctionType) -> list[Any]:
    """The values `fn`'s closure holds (variables not assigned yet have none)."""
    values = []
    for cell in fn.__closure__ or ():
        with contextlib.suppress(ValueError):  # a closure variable not assigned yet
            values.append(cell.cell_contents)
    return values
