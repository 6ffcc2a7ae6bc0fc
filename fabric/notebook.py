"""`vramfabric notebook run NB.ipynb --vram 8GiB -o OUT.ipynb`: a whole notebook on a slice.

The notebook goes to a leased slice, where nbclient executes it top to bottom with a
Jupyter kernel started in the lease's executor process (the worker needs nbclient and
ipykernel: the `notebook` extra); the executed copy, outputs and all, comes back and is
written out. A failing cell stops the run and is marked with its error, as nbconvert does;
the copy is written then too, and the command exits 1 naming the cell's error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from vramfabric.broker.errors import VramfabricError

from .sync import connect

RET_OK, RET_FAILED, RET_USAGE = 0, 1, 2


def execute_notebook(text: str, cell_timeout_s: float | None) -> tuple[str, str | None]:
    """On the slice: execute the notebook; (the executed notebook, the failing cell's error)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.reads(text, as_version=4)
    error = None
    try:
        NotebookClient(nb, timeout=cell_timeout_s).execute()
    except CellExecutionError as exc:  # recorded: the cell holds its error output, as nbconvert
        error = str(exc)
    return nbformat.writes(nb), error


def read_notebook(path: Path) -> str:
    """The notebook's text; ValueError if it is not a notebook nbformat can read."""
    import nbformat

    try:
        text = path.read_text()
        nbformat.validate(nbformat.reads(text, as_version=4))
    except (OSError, ValueError, nbformat.ValidationError) as exc:
        raise ValueError(f"{path}: not a readable notebook: {exc}") from None
    return text


def cmd_notebook_run(args: argparse.Namespace) -> int:
    """Run a notebook on a leased slice and write its executed copy."""
    source = Path(args.notebook)
    out = Path(args.output) if args.output else source.with_suffix(".out.ipynb")
    try:
        text = read_notebook(source)
    except ValueError as exc:
        print(f"vramfabric notebook run: {exc}", file=sys.stderr)
        return RET_USAGE
    try:
        with connect() as fabric, fabric.gpu(vram=args.vram, wait_s=args.wait_s) as gpu:
            node = gpu.node
            executed, error = gpu.run(
                execute_notebook, text, args.cell_timeout_s, timeout_s=args.timeout_s
            )
    except VramfabricError as exc:
        print(f"vramfabric notebook run: {exc}", file=sys.stderr)
        return RET_FAILED
    out.write_text(executed)
    if error:
        lines = error.strip().splitlines()
        print(f"vramfabric notebook run: a cell failed; written to {out}", file=sys.stderr)
        print("\n".join(lines[-5:]), file=sys.stderr)
        return RET_FAILED
    print(f"executed {source} on {node}; written to {out}")
    return RET_OK


def add_parser(sub: Any) -> None:
    """The `notebook` command and its `run` subcommand."""
    notebook = sub.add_parser("notebook", help="run a notebook on a leased GPU slice")
    p = notebook.add_subparsers(required=True).add_parser(
        "run", help="execute NB.ipynb top to bottom on one slice; write the executed copy"
    )
    p.add_argument("notebook")
    p.add_argument("-o", "--output", help="the executed copy (default NB.out.ipynb)")
    p.add_argument("--vram", help="the slice's size, e.g. 8GiB (default: the slice size)")
    p.add_argument("--cell-timeout-s", type=float, default=None, help="each cell's deadline")
    p.add_argument("--timeout-s", type=float, default=None, help="the whole run's deadline")
    p.add_argument("--wait-s", type=float, default=30.0, help="wait this long for a free slice")
    p.set_defaults(handler=cmd_notebook_run)
