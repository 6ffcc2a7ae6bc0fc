"""kernels/code.py: Python functions pickled by value, their context, inputs and outputs."""

from __future__ import annotations

import functools
import inspect
import pickle
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from vramfabric.kernels.by_value import dumps_by_value
from vramfabric.kernels.code import (
    Context,
    PythonCode,
    encode_input,
    python_version,
    wants_context,
)
from vramfabric.kernels.errors import KernelArgumentError

OFFSET = 7


def add_offset(x: int) -> int:
    """Uses a module-level constant: it must travel with the function."""
    return x + OFFSET


def with_ctx(x: int, ctx: Context) -> tuple[int, int, int | None]:
    ctx.checkpoint({"seen": x})
    return x, ctx.slice_bytes, ctx.device


def check_positive(x: int) -> int:
    if x < 0:
        raise ValueError(f"{x} is negative")  # the line a remote traceback must show
    return x


def through_a_lambda(x: int) -> int:
    return (lambda y: check_positive(y))(x)


class Scaled:
    """A callable object of the user's: its class's methods travel by value too."""

    def __init__(self, factor: int) -> None:
        self.factor = factor

    def __call__(self, x: int) -> int:
        """Scale `x`."""
        return self.scale(x)

    def scale(self, x: int) -> int:
        """`x` times the factor; a negative `x` is refused."""
        if x < 0:
            raise ValueError("cannot scale a negative")  # the line a remote traceback must show
        return x * self.factor


def context(saved: list[bytes]) -> Context:
    return Context(
        device=None, slice_bytes=2**20, xp=np, attempt=1, job="j", index=0, save=saved.append
    )


def test_a_function_round_trips_and_runs_on_pickled_inputs() -> None:
    code = PythonCode.from_blob(PythonCode.of(add_offset).to_blob())
    out = code.call(code.load(), encode_input(5), context([]))
    assert pickle.loads(out) == 12
    assert code.python == python_version()


def test_a_function_with_ctx_gets_its_context_and_checkpoints() -> None:
    saved: list[bytes] = []
    code = PythonCode.of(with_ctx)
    out = pickle.loads(code.call(code.load(), encode_input(3), context(saved)))
    assert out == (3, 2**20, None)
    assert [pickle.loads(s) for s in saved] == [{"seen": 3}]
    assert wants_context(with_ctx) and not wants_context(add_offset)


def test_a_function_from_a_test_file_runs_where_the_file_cannot_be_imported(
    tmp_path: Path,
) -> None:
    # Given a function of this module, pickled by value, and a Python that cannot import it
    blob = tmp_path / "fn.bin"
    blob.write_bytes(PythonCode.of(add_offset).to_blob())
    script = (
        "import pickle, sys\n"
        "from vramfabric.kernels.code import Context, PythonCode, encode_input\n"
        "code = PythonCode.from_blob(open(sys.argv[1], 'rb').read())\n"
        "out = code.call(code.load(), encode_input(1), None)\n"
        "print(pickle.loads(out))\n"
    )
    # When it runs there
    done = subprocess.run(
        [sys.executable, "-c", script, str(blob)], cwd=tmp_path, capture_output=True, text=True
    )
    # Then it computes with the constant it carried
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "8"


def test_an_unpickled_functions_traceback_names_its_file_and_shows_its_lines() -> None:
    # Given a function that fails inside a lambda inside a helper, pickled by value
    fn = cloudpickle.loads(dumps_by_value(through_a_lambda))
    # When it raises where it was unpickled
    with pytest.raises(ValueError) as caught:
        fn(-1)
    text = "".join(traceback.format_exception(caught.value))
    # Then every frame of the user's code names this file (not "<dynamic-code>") and its line
    assert text.count(f'File "{__file__}"') == 4, text  # the test, the function, lambda, helper
    assert "<dynamic-code>" not in text
    assert 'raise ValueError(f"{x} is negative")' in text
    # And so do a callable object's methods
    scaled = cloudpickle.loads(dumps_by_value(Scaled(2)))
    assert scaled(3) == 6
    with pytest.raises(ValueError) as caught:
        scaled(-1)
    text = "".join(traceback.format_exception(caught.value))
    assert text.count(f'File "{__file__}"') == 3, text  # the test, __call__, scale
    assert 'raise ValueError("cannot scale a negative")' in text


def test_functions_on_the_same_line_of_two_cells_keep_their_own_files(tmp_path: Path) -> None:
    # Given two notebook cells (files) each defining a lambda on line 1, and a third using both
    cells: dict[str, Any] = {"__name__": "notebook_cells"}  # not importable: by value
    for name, source in [("c1.py", "f = lambda x: x + 1"), ("c2.py", "g = lambda x: x * 2")]:
        exec(compile(source, str(tmp_path / name), "exec"), cells)
    exec(compile("def both(x):\n    return f(x), g(x)", str(tmp_path / "c3.py"), "exec"), cells)
    # When it is pickled and unpickled
    both = cloudpickle.loads(dumps_by_value(cells["both"]))
    # Then each function names its own cell
    assert both(3) == (4, 6)
    files = {k: Path(both.__globals__[k].__code__.co_filename).name for k in ("f", "g")}
    assert files == {"f": "c1.py", "g": "c2.py"}
    assert Path(both.__code__.co_filename).name == "c3.py"


def test_another_python_version_is_refused_naming_both() -> None:
    code = PythonCode.of(add_offset)
    other = PythonCode(fn_bytes=code.fn_bytes, python="2.7", max_output_bytes=100)
    with pytest.raises(KernelArgumentError, match=r"Python 2\.7.*" + python_version()):
        other.load()


def test_an_output_over_the_limit_names_both_sizes() -> None:
    code = PythonCode.of(lambda x: b"x" * x, max_output_bytes=100)
    with pytest.raises(
        KernelArgumentError, match=r"output of \d+ bytes exceeds max_output_bytes=100"
    ):
        code.call(code.load(), encode_input(1000), context([]))


@pytest.mark.parametrize("blob", [b"", b"\xc1", pickle.dumps({"kind": "python"})])
def test_a_bad_blob_is_a_clear_error(blob: bytes) -> None:
    with pytest.raises(KernelArgumentError, match="not a Python-code blob"):
        PythonCode.from_blob(blob)


def test_not_callable_work_is_refused() -> None:
    with pytest.raises(TypeError, match="callable"):
        PythonCode.of(42)  # type: ignore[arg-type]


def test_a_function_that_cannot_be_pickled_is_refused() -> None:
    import threading

    lock = threading.Lock()

    def holds_a_lock(x: Any) -> Any:
        with lock:
            return x

    with pytest.raises(TypeError, match="cannot pickle"):
        PythonCode.of(holds_a_lock)


SHARED = [1, 2]
PLAIN_VALUES: list[object] = [
    *(5, -(2**70), 1.5, "é" * 300, b"xyz", True, None, (1, 2.0, "a", b"b", None)),
    # Containers of them (what a call's payload is: function bytes, args, kwargs)
    (b"fn", (3,), {}),
    (b"fn", (1, [2.5, "x"], {"k": (None, b"v")}), {"scale": 2}),
    [[], (), {}, [[1]]],
    {1: "int key", "s": [1, 2], None: ()},
    (SHARED, SHARED, {"again": SHARED}),  # the same list three times: memoized alike
    [1] * 300,  # past the fast path's length: cloudpickle's own path
    [[[[1]]]],  # past its depth
]


@pytest.mark.parametrize("value", PLAIN_VALUES)
def test_plain_inputs_encode_as_cloudpickle_would(value: object) -> None:
    # The fast path must not change a job's inputs digest, hence its id (resume across versions)
    assert encode_input(value) == cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _positional_only(a: int, ctx: Any = None, /) -> None: ...
def _keyword_only(a: int, *, ctx: Any = None) -> None: ...
def _star(*ctx: Any) -> None: ...
def _stars(**ctx: Any) -> None: ...
def _local(a: int) -> None:
    ctx = a  # a local, not a parameter
    del ctx


def _no_ctx(a: int, *args: Any, b: int = 0, **kw: Any) -> None: ...


def _wrapped_ctx(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def _with_signature() -> Any:
    def fn(*args: Any) -> None: ...

    fn.__signature__ = inspect.signature(with_ctx)  # type: ignore[attr-defined]
    return fn


@pytest.mark.parametrize(
    "fn",
    [
        with_ctx,
        add_offset,
        _positional_only,
        _keyword_only,
        _star,
        _stars,
        _local,
        _no_ctx,
        lambda x, ctx: x,
        lambda x: x,
        _wrapped_ctx(with_ctx),  # the wrapper takes *args: inspect follows __wrapped__
        _with_signature(),
        functools.partial(with_ctx, 1),
        print,
    ],
)
def test_wants_context_reads_a_functions_parameters_as_inspect_does(fn: Any) -> None:
    try:
        expected = "ctx" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        expected = False
    assert wants_context(fn) is expected
