"""coordinator/calls/remote.py: a call's outcome as the caller sees it, raised or returned."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from vramfabric.broker import RemoteError, VramfabricError
from vramfabric.broker.errors import ErrorKind
from vramfabric.coordinator.calls.remote import MAX_VALUE_BYTES, RemoteTraceback, apply_fn, outcome
from vramfabric.kernels.code import Context


class Unloadable(Exception):
    """Pickles, but does not unpickle: its constructor takes two arguments, args holds one."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a} {b}")


def fails_unloadably() -> None:
    raise Unloadable("not", "here")


def halves(x: int) -> float:
    return x / 2


def ran(fn: Any, *args: Any) -> Any:
    """`outcome` of `fn(*args)` run as a node runs a call (its reply output pickled again)."""
    ctx = Context(device=None, slice_bytes=2**20, xp=np, attempt=1, job="j", index=0)
    return outcome(pickle.dumps(apply_fn(fn, args, {}, ctx)))


def test_a_calls_value_comes_back() -> None:
    assert ran(halves, 3) == 1.5


def test_an_exception_that_does_not_travel_is_the_one_remote_error_of_the_error_tree() -> None:
    # Given a function that raises an exception which cannot be unpickled on the caller
    # When the caller takes its outcome
    with pytest.raises(RemoteError) as info:
        ran(fails_unloadably)
    # Then it gets the broker's RemoteError (a VramfabricError), naming the type and message
    assert isinstance(info.value, VramfabricError)
    assert info.value.remote_kind is ErrorKind.ERROR
    assert info.value.error == "Unloadable: not here"
    # And its cause carries the frames as they were where it was raised
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "fails_unloadably" in info.value.__cause__.text


def test_a_value_past_what_a_call_brings_back_is_refused_in_the_callers_terms() -> None:
    # A value of 64 MiB pickles past the limit: the caller hears why, not `apply`'s own limit
    with pytest.raises(ValueError, match=f"a call brings back at most {MAX_VALUE_BYTES}"):
        ran(bytes, MAX_VALUE_BYTES)
    assert len(ran(bytes, MAX_VALUE_BYTES - 64)) == MAX_VALUE_BYTES - 64
