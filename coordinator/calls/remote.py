"""Both ends of one interactive call's payload: a function, its arguments, its outcome.

`apply` is the work every interactive call runs (uploaded once per tenant, like any
function): it runs in an executor process, never in a node agent, unpickles the call's
function and arguments, calls it (what it prints sent to the caller as it prints it), and
pickles what came of it: the value, or the exception with its traceback formatted where it
was raised. `outcome` turns that back into the value, or raises the exception from a
`RemoteTraceback` carrying the remote frames.
"""

from __future__ import annotations

import contextlib
import pickle
import traceback
from typing import Any

import attrs
import cloudpickle

from vramfabric.broker.errors import ErrorKind, RemoteError
from vramfabric.kernels.by_value import dumps_by_value
from vramfabric.kernels.code import DEFAULT_MAX_OUTPUT_BYTES, Context, encode_input, wants_context

from .printed import sent_while_running

# A call's value at most, pickled: `apply`'s output limit (a job's default, call_work) less
# room for the node's own pickle of apply's bytes around it.
MAX_VALUE_BYTES = DEFAULT_MAX_OUTPUT_BYTES - 2**10


class RemoteTraceback(Exception):
    """The traceback of an exception raised on the node (the `__cause__` of the one raised)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\nTraceback on the node:\n{self.text}"""'


def unsent(summary: str) -> RemoteError:
    """What is raised in place of an exception that could not be sent back as itself.

    `summary` is its "Type: message" line; the broker's one RemoteError carries it.
    """
    return RemoteError(ErrorKind.ERROR, summary)


def call_input(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What `apply` receives: the function pickled by value, and the arguments.

    Raises:
        TypeError: the function or an argument cannot be pickled.
    """
    return (dumps_by_value(fn), args, kwargs)


def apply(payload: Any, ctx: Context) -> bytes:
    """Call the payload's function on its arguments; the pickled outcome (never raises).

    What the function prints goes to the caller while it runs, through the call's checkpoint
    channel (printed.py; a call is never delivered again, so it has no checkpoints of its
    own: the function's `ctx.checkpoint` says they are not available).
    """
    fn_bytes, args, kwargs = payload
    return apply_fn(cloudpickle.loads(fn_bytes), args, kwargs, ctx)


def apply_fn(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: Context) -> bytes:
    """`apply` of a function already at hand (work that brings its own, such as a notebook run)."""
    channel = ctx._save
    if wants_context(fn):
        kwargs = {**kwargs, "ctx": attrs.evolve(ctx, save=None)}
    with sent_while_running(channel) if channel else contextlib.nullcontext():
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:  # recorded: it travels back and is raised to the caller
            return _raised(exc)
    try:
        # As cloudpickle would pickle it, at a fraction of the cost for plain values.
        data = encode_input(("ok", value))
    except Exception as exc:  # recorded: the caller learns the value could not travel
        return _raised(TypeError(f"the function's result cannot be pickled: {exc}"))
    if len(data) > MAX_VALUE_BYTES:
        # Said here, in the caller's terms: past it the node would fail the call naming a
        # limit of `apply`'s that the caller has no way to set.
        return _raised(
            ValueError(
                f"the call's value is {len(data)} bytes pickled; a call brings back at most "
                f"{MAX_VALUE_BYTES} (return less, or write it where the caller can read it)"
            )
        )
    return data


def _raised(exc: BaseException) -> bytes:
    text = "".join(traceback.format_exception(exc))
    try:
        sent = cloudpickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        cloudpickle.loads(sent)  # some exceptions pickle but do not unpickle
    except Exception:  # recorded: it is sent as a RemoteError naming it
        sent = b""
    body = ("raised", sent, text, f"{type(exc).__name__}: {exc}")
    return cloudpickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[no-any-return]


def outcome(data: bytes) -> Any:
    """The value a call returned, or raise the exception it raised (from its traceback)."""
    body = pickle.loads(pickle.loads(data))
    if body[0] == "ok":
        return body[1]
    _, sent, text, summary = body
    exc = pickle.loads(sent) if sent else unsent(summary)
    raise exc from RemoteTraceback(text)
