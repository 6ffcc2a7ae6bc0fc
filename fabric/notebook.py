"""`vramfabric notebook run NB.ipynb --vram 8GiB -o OUT.ipynb`: a whole notebook on a slice.

The notebook's folder (its data files and modules, bounded: fabric/shipping.py) goes to a
leased slice with it; there nbclient executes the notebook top to bottom in a Jupyter
kernel started in the lease's executor process, in place: its `connect()` blocks and maps,
and its `%%gpu` cells, run on that same slice (fabric/in_place.py). The worker needs
nbclient and ipykernel (the `notebook` extra). The executed copy, outputs and all, comes
back and is written out, also when a cell fails or runs past its deadline: then it has
every cell run until then, the command names the cell that stopped the run, prints the
end of its error (without terminal colour codes) and exits 1.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from vramfabric.broker.errors import VramfabricError

from .notebook_node import notebook_work
from .shipping import FolderTooLarge, pack_folder
from .sync import connect_fabric

RET_OK, RET_FAILED, RET_USAGE = 0, 1, 2
# What the slice may take beyond the run's own deadline: the kernel's shutdown, the copy.
_WRAP_UP_S = 60.0
# Terminal colour and cursor codes, as IPython's tracebacks carry them.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def read_notebook(path: Path) -> Any:
    """The notebook; ValueError if it is not a notebook nbformat can read."""
    import nbformat

    try:
        nb = nbformat.reads(path.read_text(), as_version=4)
        nbformat.validate(nb)
    except (OSError, ValueError, nbformat.ValidationError) as exc:
        raise ValueError(f"{path}: not a readable notebook: {exc}") from None
    return nb


def cmd_notebook_run(args: argparse.Namespace) -> int:
    """Run a notebook on a leased slice and write its executed copy."""
    source = Path(args.notebook)
    out = Path(args.output) if args.output else source.with_suffix(".out.ipynb")
    try:
        nb = read_notebook(source)
        archive = pack_folder(source.resolve().parent, leave_out=[out])
    except (ValueError, FolderTooLarge, OSError) as exc:
        print(f"vramfabric notebook run: {exc}", file=sys.stderr)
        return RET_USAGE
    run_s = args.timeout_s
    call_s = None if run_s is None else run_s + _WRAP_UP_S
    try:
        with connect_fabric() as fabric, fabric.gpu(vram=args.vram, wait_s=args.wait_s) as gpu:
            node = gpu.node
            payload = (source.name, args.cell_timeout_s, run_s, node)
            ran = gpu.run_work(notebook_work(archive), payload, timeout_s=call_s)
    except VramfabricError as exc:
        print(f"vramfabric notebook run: {exc}", file=sys.stderr)
        return RET_FAILED
    out.write_text(ran["notebook"])
    if ran["error"] is None:
        print(f"executed {source} on {node}; written to {out}")
        return RET_OK
    _say_failed(nb, ran, out)
    return RET_FAILED


def _say_failed(nb: Any, ran: dict[str, Any], out: Path) -> None:
    """Name the cell that stopped the run, and the end of its error, in plain text."""
    index = ran["cell"]
    where = "the run" if index is None else f"cell {index + 1} of {ran['cells']}"
    if index is not None:
        first = nb.cells[index].source.strip().splitlines()[:1]
        where += f" ({first[0][:60]!r})" if first else ""
    print(f"vramfabric notebook run: {where} failed; executed copy in {out}", file=sys.stderr)
    lines = _ANSI.sub("", ran["error"]).strip().splitlines()
    print("\n".join(lines[-8:]), file=sys.stderr)


def add_parser(sub: Any) -> None:
    """The `notebook` command and its `run` subcommand."""
    notebook = sub.add_parser("notebook", help="run a notebook on a leased GPU slice")
    p = notebook.add_subparsers(required=True).add_parser(
        "run",
        help="execute NB.ipynb top to bottom on one slice, its folder shipped with it (at most "
        "64 MiB); write the executed copy",
    )
    p.add_argument("notebook")
    p.add_argument("-o", "--output", help="the executed copy (default NB.out.ipynb)")
    p.add_argument("--vram", help="the slice's size, e.g. 8GiB (default: the slice size)")
    p.add_argument("--cell-timeout-s", type=float, default=None, help="each cell's deadline")
    p.add_argument("--timeout-s", type=float, default=None, help="the whole run's deadline")
    p.add_argument("--wait-s", type=float, default=30.0, help="wait this long for a free slice")
    p.set_defaults(handler=cmd_notebook_run)
