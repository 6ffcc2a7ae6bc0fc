"""The `%%gpu` cell magic: one cell run on a leased slice, its state brought back.

    %load_ext vramfabric
    %%gpu --vram 4GiB
    y = model(x)          # runs on the slice; `x` went there, `y` comes back

The cell's source and the notebook variables it reads go to the slice (cloudpickle; up to a
call's limit on its arguments, through the object store past a message's size); it runs there
in an executor process; what it prints comes back as it prints it; the variables it assigns
(up to a job's output limit in all, through the object store past a message's size) come
back when it ends, and the value of its last expression is displayed, as in any cell.
A variable that cannot be sent is named in a clear error before anything is leased.
The slice is held only while the cell runs (released on an exception and on Ctrl-C too).
The fabric is reached with `vramfabric.connect()` (settings from the environment) at the
first `%%gpu` cell. IPython is imported only by IPython itself, never by the slice.
"""

from __future__ import annotations

import ast
import pickle
import sys
import traceback
from typing import Any

import cloudpickle

from vramfabric.kernels.code import DEFAULT_MAX_OUTPUT_BYTES

from .in_place import InPlaceFabric, InPlaceSettings
from .sync import SyncFabric, connect

CELL_NAME = "<%%gpu cell>"
# What a cell's assigned values and shown value may add up to, pickled: a call's outcome
# may be as large as a job's output, less room for the rest of it.
MAX_BROUGHT_BACK_BYTES = DEFAULT_MAX_OUTPUT_BYTES - 2**20


def run_cell(source: str, variables: dict[str, Any], assigns: list[str]) -> dict[str, Any]:
    """On the slice: exec the cell over `variables`; what it assigned, showed and raised.

    What it prints goes to the notebook as it prints it (the call's printed text). Assigned
    values travel pickled, each on its own, so one that cannot come back is named, not fatal.
    """
    namespace = {"__name__": "__main__", **variables}
    error: tuple[bytes, str] | None = None
    shown: Any = None
    try:
        shown = _exec(source, namespace)
    except Exception as exc:  # recorded: it travels back and is raised in the notebook
        error = (_pickled_or_empty(exc), "".join(traceback.format_exception(exc)))
    budget = [MAX_BROUGHT_BACK_BYTES]
    assigned: dict[str, bytes] = {}
    unsent: list[tuple[str, str]] = []
    for name in assigns:
        if name in namespace:
            data, why = _brought_back(namespace[name], budget)
            if data is None:
                unsent.append((name, why))
            else:
                assigned[name] = data
    return {
        "assigned": assigned,
        "unsent": unsent,
        "shown": None if shown is None else _shown(shown, budget),
        "error": error,
    }


def _exec(source: str, namespace: dict[str, Any]) -> Any:
    """Run the cell as a module's top level; the value of its last expression, as a cell shows.

    A last expression ending in `;` shows nothing, as in a notebook.
    """
    tree = ast.parse(source)
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr) or source.rstrip().endswith(";"):
        exec(compile(tree, CELL_NAME, "exec"), namespace)
        return None
    exec(compile(ast.Module(body=tree.body[:-1], type_ignores=[]), CELL_NAME, "exec"), namespace)
    return eval(compile(ast.Expression(last.value), CELL_NAME, "eval"), namespace)


def _brought_back(value: Any, budget: list[int]) -> tuple[bytes | None, str]:
    """`value` pickled if it can come back within what is left of `budget` (then spent)."""
    try:
        data = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)
    except Exception as exc:  # recorded: the reason travels back, the notebook says it
        return None, f"cannot be pickled: {type(exc).__name__}: {exc}"
    if len(data) > budget[0]:
        return None, (
            f"too large: {len(data)} bytes pickled (a cell brings back at most "
            f"{MAX_BROUGHT_BACK_BYTES} bytes in all)"
        )
    budget[0] -= len(data)
    return data, ""


def _shown(value: Any, budget: list[int]) -> tuple[str, Any]:
    """The last expression's value to display: pickled, or its repr if it cannot travel."""
    data, _why = _brought_back(value, budget)
    if data is not None:
        return ("value", data)
    return ("repr", repr(value)[:100_000])


def _pickled_or_empty(exc: BaseException) -> bytes:
    try:
        data = cloudpickle.dumps(exc)
        pickle.loads(data)
        return data  # type: ignore[no-any-return]
    except Exception:  # recorded: the notebook raises a RemoteError naming it instead
        return b""


def reads_and_assigns(source: str) -> tuple[set[str], set[str]]:
    """The names a cell reads and the names it assigns (at any depth; ValueError if no parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"the cell does not parse: {exc}") from None
    reads: set[str] = set()
    assigns: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (reads if isinstance(node.ctx, ast.Load) else assigns).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            assigns.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            assigns.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            reads.add(node.target.id)
    return reads, assigns


def variables_to_send(source: str, namespace: dict[str, Any], hidden: set[str]) -> dict[str, Any]:
    """The notebook variables the cell reads; ValueError naming one that cannot be sent."""
    reads, _ = reads_and_assigns(source)
    sent = {n: namespace[n] for n in sorted(reads) if n in namespace and n not in hidden}
    for name, value in sent.items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:  # pickling fails in many ways (locks, sockets, C objects)
            raise ValueError(
                f"variable {name!r} ({type(value).__name__}) cannot be sent to the GPU slice: "
                f"{type(exc).__name__}: {exc}"
            ) from None
    return sent


class GpuMagic:
    """The `%%gpu` magic of one IPython shell, with the fabric it connects on first use."""

    def __init__(self, shell: Any) -> None:
        """Serve `shell`; nothing is connected until the first `%%gpu` cell."""
        self.shell = shell
        self.fabric: SyncFabric | InPlaceFabric | None = None

    def gpu(self, line: str, cell: str) -> Any:
        """`%%gpu [--vram SIZE] [--timeout-s S]`: run the cell on a leased slice.

        Returns the value of the cell's last expression, which the notebook displays.
        """
        from IPython.core.error import UsageError

        vram, timeout_s = _options(line, UsageError)
        if InPlaceSettings.from_env().active:
            # This kernel runs on a slice already (`vramfabric notebook run`): the cell runs
            # here, as an ordinary cell; its exceptions are the cell's own.
            return _exec(cell, self.shell.user_ns)
        hidden = set(getattr(self.shell, "user_ns_hidden", {}))
        try:
            sent = variables_to_send(cell, self.shell.user_ns, hidden)
            _, assigns = reads_and_assigns(cell)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if self.fabric is None:
            self.fabric = connect()
        with self.fabric.gpu(vram=vram) as gpu:
            out = gpu.run(run_cell, cell, sent, sorted(assigns), timeout_s=timeout_s)
        unsent = list(out["unsent"])
        for name, data in out["assigned"].items():
            try:
                self.shell.user_ns[name] = pickle.loads(data)
            except Exception as exc:  # recorded: named on stderr with the others
                unsent.append((name, f"cannot be unpickled here: {type(exc).__name__}: {exc}"))
        for name, why in unsent:
            sys.stderr.write(f"%%gpu: {name!r} not brought back: {why}\n")
        if out["error"] is not None:
            _raise(*out["error"])
        return _displayed(out["shown"])


def _displayed(shown: tuple[str, Any] | None) -> Any:
    """What the notebook displays for the cell's last expression (None: nothing)."""
    if shown is None:
        return None
    kind, body = shown
    return pickle.loads(body) if kind == "value" else Shown(body)


class Shown:
    """A last expression's value that could not come back, displayed by its remote repr."""

    def __init__(self, text: str) -> None:
        """Display `text`."""
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _options(line: str, usage: type[Exception]) -> tuple[str | None, float | None]:
    """`--vram SIZE` and `--timeout-s S` from the magic's line."""
    words, vram, timeout_s = line.split(), None, None
    while words:
        word = words.pop(0)
        if word in ("--vram", "--timeout-s") and words:
            value = words.pop(0)
            if word == "--vram":
                vram = value
            else:
                timeout_s = float(value)
        else:
            raise usage(f"%%gpu: unknown option {word!r} (use --vram SIZE, --timeout-s S)")
    return vram, timeout_s


def _raise(sent: bytes, text: str) -> None:
    from vramfabric.coordinator.calls.remote import RemoteTraceback, unsent

    exc = pickle.loads(sent) if sent else unsent(text.strip().splitlines()[-1])
    raise exc from RemoteTraceback(text)


def load_ipython_extension(shell: Any) -> None:
    """`%load_ext vramfabric`: register `%%gpu` on this shell."""
    magic = GpuMagic(shell)
    shell.register_magic_function(magic.gpu, magic_kind="cell", magic_name="gpu")
