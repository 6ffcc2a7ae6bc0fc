"""Reading chunk outputs by dtype: one output whole, its scalar, or a run of scalars at once.

A dtype is a numeric numpy dtype name (`float32`, `float64`, `int64`...), `bytes` (raw), or
`pickle` (a Python-callable job's `pickle.dumps` of its return value). `scalar` is the one
place a scalar is read; `scalars` reads a run of them as `scalar` would each, at a fraction
of the cost per output (a pack's outputs, folded at once).

Unpickling runs `pickle.loads` on bytes that came back from the fabric, so a `pickle` output
is only as trustworthy as the workers that produced it: run such jobs on workers you trust.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

PICKLE = "pickle"
BYTES = "bytes"
# numpy kinds that read as one real number: bool, signed and unsigned int, float
_SCALAR_KINDS = "biuf"


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype for a numeric dtype name; ValueError for an unknown or unreadable one."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(
            f"unknown output dtype {dtype!r}; expected a numpy dtype name, 'bytes' or 'pickle'"
        ) from None
    if dt.hasobject or dt.itemsize == 0:
        # object arrays cannot come from a buffer and a zero-size element has no value
        raise ValueError(f"output dtype {dtype!r} cannot be read from bytes")
    return dt


def check_dtype(dtype: str) -> str:
    """`dtype` itself if it names an output encoding, else ValueError."""
    if dtype not in (PICKLE, BYTES):
        numpy_dtype(dtype)
    return dtype


def unpickle(output: bytes) -> Any:
    """The object a Python-callable job returned (trusts the worker that produced it)."""
    try:
        return pickle.loads(output)
    except (pickle.UnpicklingError, EOFError) as exc:
        raise ValueError(f"output of {len(output)} bytes is not a pickle: {exc}") from None


def scalar(output: bytes, dtype: str) -> float:
    """The output as one Python float: the first element, or the unpickled number."""
    if dtype == PICKLE:
        obj = unpickle(output)
        # float("1.5") would succeed, but a string is not a numeric result
        if not isinstance(obj, (str, bytes, bytearray)):
            try:
                return float(obj)
            except (TypeError, ValueError, OverflowError):
                pass
        raise ValueError(f"pickled output is a {type(obj).__name__}, not a number")
    if dtype == BYTES:
        raise ValueError(
            "outputs of dtype 'bytes' have no scalar value; use Gather, Collect or Fold"
        )
    dt = numpy_dtype(dtype)
    if dt.kind not in _SCALAR_KINDS:
        raise ValueError(f"outputs of dtype {dtype!r} have no real scalar value")
    if len(output) < dt.itemsize:
        raise ValueError(
            f"output of {len(output)} bytes is shorter than one {dt.name} ({dt.itemsize} bytes)"
        )
    return float(np.frombuffer(output, dtype=dt, count=1)[0])


def decode(output: bytes, dtype: str) -> Any:
    """The whole output: the unpickled object, the raw bytes, or a writable numpy array."""
    if dtype == PICKLE:
        return unpickle(output)
    if dtype == BYTES:
        return bytes(output)
    dt = numpy_dtype(dtype)
    if len(output) % dt.itemsize:
        raise ValueError(
            f"output of {len(output)} bytes is not a whole number of {dt.name} "
            f"({dt.itemsize} bytes each)"
        )
    # frombuffer over immutable bytes is read-only; the copy owns writable memory
    return np.frombuffer(output, dtype=dt).copy()


# Python types whose pickled outputs `scalars` reads at once: `scalar` takes them as float().
_NUMBERS = frozenset((float, int, bool))


def scalars(outputs: Sequence[bytes], dtype: str) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Each output's scalar, as `scalar` reads it, in one float64 array.

    Raises:
        ValueError: an output has no scalar value (the same as `scalar` would raise).
    """
    if dtype == PICKLE:
        floats = _pickled_floats(outputs)
        if floats is not None:
            return floats
        objs = list(map(unpickle, outputs))
        if set(map(type, objs)) <= _NUMBERS:
            try:
                return np.array(objs, dtype=np.float64)
            except OverflowError:  # an int past float64's range: float() says so
                pass
        return np.array([scalar(o, dtype) for o in outputs], dtype=np.float64)
    if dtype != BYTES:
        dt = numpy_dtype(dtype)
        if dt.kind in _SCALAR_KINDS and all(len(o) == dt.itemsize for o in outputs):
            return np.frombuffer(b"".join(outputs), dtype=dt).astype(np.float64)
    return np.array([scalar(o, dtype) for o in outputs], dtype=np.float64)


# `pickle.dumps` of any float at the highest protocol (as executors pickle): this header
# (protocol, a frame of 10 bytes, BINFLOAT), 8 big-endian bytes, STOP: always 21 bytes.
_FLOAT_PICKLE = pickle.dumps(0.0, protocol=pickle.HIGHEST_PROTOCOL)
_FLOAT_PICKLE_HEAD = np.frombuffer(_FLOAT_PICKLE[:12], dtype=np.uint8)
_FLOAT_PICKLE_BYTES = len(_FLOAT_PICKLE)


def _pickled_floats(outputs: Sequence[bytes]) -> np.ndarray[Any, np.dtype[np.float64]] | None:
    """The floats of outputs that are all pickled floats, read at once; None if any is not.

    Unpickling each was most of what folding a pack of a loss function's outputs cost.
    Every row of the joined bytes must be a float's pickle: as each pickle of that header
    is 21 bytes long, the rows are the outputs.
    """
    n = len(outputs)
    joined = b"".join(outputs)
    if not n or len(joined) != n * _FLOAT_PICKLE_BYTES:
        return None
    rows = np.frombuffer(joined, dtype=np.uint8).reshape(n, _FLOAT_PICKLE_BYTES)
    if not ((rows[:, :12] == _FLOAT_PICKLE_HEAD).all() and (rows[:, -1] == ord(".")).all()):
        return None
    return rows[:, 12:20].copy().view(">f8").ravel().astype(np.float64)
