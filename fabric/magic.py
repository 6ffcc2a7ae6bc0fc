"""The `%%gpu` cell magic: one cell run on a leased slice, its state brought back.

    %load_ext vramfabric
    %%gpu --vram 4GiB
    y = model(x)          # runs on the slice; `x` went there, `y` comes back

The cell's source and the notebook variables it reads go to the slice (cloudpickle); it runs
there in an executor process; the variables it assigns, and its stdout and stderr, come
back. A variable that cannot be sent is named in a clear error before anything is leased.
The slice is held only while the cell runs (released on an exception and on Ctrl-C too).
The fabric is reached with `vramfabric.connect()` (settings from the environment) at the
first `%%gpu` cell. IPython is imported only by IPython itself, never by the slice.
"""

from __future__ import annotations

import ast
import contextlib
import io
import pickle
import sys
import traceback
from typing import Any

import cloudpickle

from .sync import SyncFabric, connect


def run_cell(source: str, variables: dict[str, Any], assigns: list[str]) -> dict[str, Any]:
    """On the slice: exec the cell over `variables`; what it printed, assigned and raised."""
    namespace = {"__name__": "__main__", **variables}
    out, err = io.StringIO(), io.StringIO()
    error: tuple[bytes, str] | None = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile(source, "<%%gpu cell>", "exec"), namespace)
        except Exception as exc:  # recorded: it travels back and is raised in the notebook
            error = (_pickled_or_empty(exc), "".join(traceback.format_exception(exc)))
    assigned, unsent = {}, []
    for name in assigns:
        if name in namespace:
            try:
                pickle.loads(cloudpickle.dumps(namespace[name]))
                assigned[name] = namespace[name]
            except Exception:  # recorded: named in `unsent`, the notebook says so
                unsent.append(name)
    return {
        "assigned": assigned,
        "unsent": unsent,
        "stdout": out.getvalue(),
        "stderr": err.getvalue(),
        "error": error,
    }


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
        self.fabric: SyncFabric | None = None

    def gpu(self, line: str, cell: str) -> None:
        """`%%gpu [--vram SIZE] [--timeout-s S]`: run the cell on a leased slice."""
        from IPython.core.error import UsageError

        vram, timeout_s = _options(line, UsageError)
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
        sys.stdout.write(out["stdout"])
        sys.stderr.write(out["stderr"])
        self.shell.user_ns.update(out["assigned"])
        if out["unsent"]:
            names = ", ".join(out["unsent"])
            sys.stderr.write(f"%%gpu: not brought back (cannot be pickled): {names}\n")
        if out["error"] is not None:
            _raise(*out["error"])


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
    from vramfabric.coordinator.remote import RemoteError, RemoteTraceback

    exc = pickle.loads(sent) if sent else RemoteError(text.strip().splitlines()[-1])
    raise exc from RemoteTraceback(text)


def load_ipython_extension(shell: Any) -> None:
    """`%load_ext vramfabric`: register `%%gpu` on this shell."""
    magic = GpuMagic(shell)
    shell.register_magic_function(magic.gpu, magic_kind="cell", magic_name="gpu")
