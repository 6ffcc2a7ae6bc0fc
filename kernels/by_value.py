"""Objects pickled by value: a function with its module's code, and the files it came from.

`dumps_by_value(fn)` pickles `fn` with cloudpickle, the module it is defined in by value
(scripts, notebooks and test files need no install on the workers), and records which file
each of its pieces of code came from: cloudpickle 3.1.3 and later ship such code as from
"<dynamic-code>", and a traceback raised on a node should name the user's file and line.
Unpickling (in an executor process, never the node agent) puts the file names back.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import sys
import sysconfig
import types
import zlib
from typing import Any

import attrs
import cloudpickle

# Code under these folders is installed on workers too: pickled by reference.
_INSTALLED = tuple(
    sorted({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
)


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
