"""msgpack <-> attrs for the wire types, rejecting bad payloads with `InvalidMessage`.

A payload is a msgpack map of field names plus `t` (the type name) and `v` (the protocol
version). Unknown keys are ignored, so a newer peer may add fields within one version.
Decoding never trusts the payload: every field is type-checked and then the class validators run.
"""

from __future__ import annotations

import enum
import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import msgpack

from .errors import InvalidMessage, RemoteError
from .messages import PROTOCOL_VERSION, ErrorReply

T = TypeVar("T")
U = TypeVar("U")
Conv = Callable[[Any], Any]

# The server's default max_payload; nothing valid is larger, so nothing larger is unpacked.
MAX_PAYLOAD_BYTES = 1024 * 1024


def encode(obj: Any) -> bytes:
    """Serialise a wire object (an attrs instance) to msgpack bytes."""
    body = _unstructure(obj)
    body["t"] = type(obj).__name__
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


def decode(
    cls: type[T], data: bytes | bytearray | memoryview, *, max_bytes: int = MAX_PAYLOAD_BYTES
) -> T:
    """Parse `data` as a `cls`; raise InvalidMessage, or RemoteError for an ErrorReply."""
    return _decode((cls,), data, max_bytes)  # type: ignore[no-any-return]


def decode_one_of(
    classes: tuple[type[T], type[U]],
    data: bytes | bytearray | memoryview,
    *,
    max_bytes: int = MAX_PAYLOAD_BYTES,
) -> T | U:
    """Parse `data` as whichever of two classes its type tag names (a chunk or a pack, say)."""
    return _decode(classes, data, max_bytes)  # type: ignore[no-any-return]


def _decode(
    classes: tuple[type[Any], ...], data: bytes | bytearray | memoryview, max_bytes: int
) -> Any:
    what = " or ".join(cls.__name__ for cls in classes)
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidMessage(what, f"payload is {type(data).__name__}, not bytes")
    if len(data) > max_bytes:
        raise InvalidMessage(what, f"payload of {len(data)} bytes exceeds {max_bytes}")
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many unrelated types for garbage
        raise InvalidMessage(what, f"not msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(body, dict):
        raise InvalidMessage(what, f"expected a map, got {type(body).__name__}")
    tag = body.get("t")
    if tag == "ErrorReply" and ErrorReply not in classes:
        reply = _structure(ErrorReply, body, "ErrorReply")
        raise RemoteError(reply.kind, reply.error)
    cls = next((c for c in classes if c.__name__ == tag), None)
    if cls is None:
        raise InvalidMessage(what, f"type tag is {tag!r}, expected {what!r}")
    version = body.get("v")
    if version != PROTOCOL_VERSION:
        raise InvalidMessage(
            cls.__name__,
            f"protocol version {version!r} is not supported (this peer speaks {PROTOCOL_VERSION})",
        )
    return _structure(cls, body, cls.__name__)


# Values that msgpack takes as they are: checked first, since most fields are one of these.
_PLAIN = (str, bytes, int, float, bool, type(None))


# Exact types msgpack takes as they are: a per-field set lookup on the hot path (results and
# chunks), where isinstance would also have to rule out str-valued enums.
_PLAIN_TYPES = frozenset(_PLAIN)


def _unstructure(value: Any) -> Any:
    if type(value) in _PLAIN_TYPES:
        return value
    if attrs.has(type(value)):
        names = _field_names(type(value))  # type: ignore[arg-type]  # python/mypy#11470
        body = {}
        for name in names:
            field = getattr(value, name)
            body[name] = field if type(field) in _PLAIN_TYPES else _unstructure(field)
        return body
    if isinstance(value, _PLAIN) and not isinstance(value, enum.Enum):
        return value  # a subclass of a plain type (not an enum)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        if set(map(type, value)) <= _PLAIN_TYPES:
            return value  # msgpack packs a tuple as an array; per item, calls cost the most
        return [_unstructure(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _unstructure(v) for k, v in value.items()}
    return value


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in attrs.fields(cls))


def _structure(cls: type[T], body: dict[str, Any], what: str) -> T:
    kwargs: dict[str, Any] = {}
    for name, conv, required in _plan(cls):  # type: ignore[arg-type]  # python/mypy#11470
        if name in body:
            try:
                kwargs[name] = conv(body[name])
            except (TypeError, ValueError) as exc:
                raise InvalidMessage(what, f"field {name!r}: {exc}") from None
        elif required:
            raise InvalidMessage(what, f"missing field {name!r}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(what, str(exc)) from None


@functools.cache
def _plan(cls: type) -> tuple[tuple[str, Conv, bool], ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        (f.name, _converter(hints[f.name]), f.default is attrs.NOTHING) for f in attrs.fields(cls)
    )


def _converter(tp: Any) -> Conv:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [_converter(a) for a in args if a is not type(None)]
        return _optional(inner[0]) if len(inner) == 1 else _fail(f"unsupported union {tp}")
    if origin is tuple:
        return _tuple_of(_converter(args[0]), _passed_as_is(args[0]))
    if origin in (Mapping, dict, typing.Mapping):
        return _map_of(_converter(args[1]))
    if tp is Any:
        return _primitive
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp
    if isinstance(tp, type) and attrs.has(tp):
        return lambda v: _structure(tp, _expect(dict, v), tp.__name__)
    return _SCALARS[tp]


def _expect(tp: type | tuple[type, ...], value: Any) -> Any:
    # bool is an int subclass: never let True stand for a count or a number of seconds.
    if not isinstance(value, tp) or (tp is not bool and isinstance(value, bool)):
        name = tp.__name__ if isinstance(tp, type) else " or ".join(t.__name__ for t in tp)
        raise TypeError(f"expected {name}, got {type(value).__name__}")
    return value


def _exactly(tp: type) -> Conv:
    """A converter passing a value of exactly `tp` at once, checking others with `_expect`."""

    def convert(value: Any) -> Any:
        return value if type(value) is tp else tp(_expect(tp, value))

    return convert


def _float(value: Any) -> float:
    return value if type(value) is float else float(_expect((int, float), value))


_SCALARS: dict[Any, Conv] = {
    int: _exactly(int),
    float: _float,
    str: _exactly(str),
    bytes: _exactly(bytes),
    bool: _exactly(bool),
}


def _optional(conv: Conv) -> Conv:
    return lambda v: None if v is None else conv(v)


def _tuple_of(conv: Conv, as_is: frozenset[type]) -> Conv:
    """Items converted by `conv`; at once if all are of types `conv` passes as they are."""

    def convert(v: Any) -> tuple[Any, ...]:
        items = _expect(list, v)
        if set(map(type, items)) <= as_is:
            return tuple(items)  # a pack's inputs or outputs: per item, calls cost the most
        return tuple(map(conv, items))

    return convert


def _passed_as_is(tp: Any) -> frozenset[type]:
    """The exact types a converter of `tp` returns unchanged (none for classes, enums)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _passed_as_is(inner[0]) | {type(None)} if len(inner) == 1 else frozenset()
    return frozenset((tp,)) if tp in (int, str, bytes, bool) else frozenset()


def _map_of(conv: Conv) -> Conv:
    def convert(v: Any) -> dict[str, Any]:
        return {_expect(str, k): conv(x) for k, x in _expect(dict, v).items()}

    return convert


def _primitive(value: Any) -> Any:
    if isinstance(value, dict | list):
        raise TypeError("expected a scalar (int, float, str, bytes, bool or nil)")
    return value


def _fail(why: str) -> Conv:
    raise TypeError(why)
