"""What runs on the slice for `vramfabric notebook run`: the folder, the kernel, the copy.

The run's work is `run_shipped` with the notebook's folder bound in (fabric/shipping.py):
on the slice it unpacks the folder, executes the notebook with nbclient in a Jupyter kernel
started there, in the folder, told through its environment that it runs in place
(fabric/in_place.py: `connect()` and `%%gpu` use this slice), and answers as
`remote.apply` does. However the run ends (a cell raised, ran past its deadline or past
the run's, the kernel died) the executed notebook comes back with every cell run so far,
and names the cell that stopped it.
"""

from __future__ import annotations

import functools
import math
import os
import time
from pathlib import Path
from typing import Any

from vramfabric.coordinator.calls.remote import apply_fn
from vramfabric.coordinator.jobs.work import JobWork, job_work
from vramfabric.kernels.code import DEFAULT_MAX_OUTPUT_BYTES, Context

from .in_place import InPlaceSettings
from .shipping import unpacked


def notebook_work(archive: bytes) -> JobWork:
    """The work of one notebook run: `run_shipped` with the folder's archive bound in."""
    return job_work(functools.partial(run_shipped, archive), DEFAULT_MAX_OUTPUT_BYTES)


def run_shipped(archive: bytes, payload: Any, ctx: Context) -> bytes:
    """On the slice: the folder unpacked, the notebook in it executed; `apply`'s outcome."""
    notebook, cell_timeout_s, run_timeout_s, node = payload
    with unpacked(archive) as folder:
        args = (folder / notebook, cell_timeout_s, run_timeout_s, node)
        return apply_fn(execute_notebook, args, {}, ctx)


def execute_notebook(
    path: Path, cell_timeout_s: float | None, run_timeout_s: float | None, node: str, ctx: Context
) -> dict[str, Any]:
    """Execute the notebook at `path`; the executed copy, and which cell stopped it and why.

    Returns `{"notebook": text, "cell": index or None, "cells": count, "error": text or None}`.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    deadline = None if run_timeout_s is None else time.monotonic() + run_timeout_s
    started: list[int] = []

    def timeout_of(_cell: Any) -> int | None:
        wait_s = cell_timeout_s
        if deadline is not None:
            left_s = max(1.0, deadline - time.monotonic())
            wait_s = left_s if wait_s is None else min(wait_s, left_s)
        return None if wait_s is None else math.ceil(wait_s)

    def cell_started(cell: Any, cell_index: int) -> None:
        started.append(cell_index)

    client = NotebookClient(
        nb,
        timeout_func=timeout_of,
        on_cell_start=cell_started,
        resources={"metadata": {"path": str(path.parent)}},
    )
    in_place = InPlaceSettings(ctx.slice_bytes, ctx.device, node, ctx.job)
    error: str | None = None
    try:
        client.execute(env={**os.environ, **in_place.to_env()})
    except CellExecutionError as exc:  # recorded: the cell holds its error output, as nbconvert
        error = str(exc)
    except CellTimeoutError:  # recorded: the copy has what the cell printed until then
        error = _timed_out(cell_timeout_s, run_timeout_s, deadline)
    except DeadKernelError as exc:  # recorded: the copy has every cell run before
        error = f"the kernel died: {exc}"
    return {
        "notebook": nbformat.writes(nb),
        "cell": started[-1] if error is not None and started else None,
        "cells": len(nb.cells),
        "error": error,
    }


def _timed_out(cell_s: float | None, run_s: float | None, deadline: float | None) -> str:
    if cell_s is None or (deadline is not None and time.monotonic() >= deadline - 1.0):
        return f"the run did not finish within --timeout-s {run_s:g} s"
    return f"the cell did not finish within --cell-timeout-s {cell_s:g} s"
