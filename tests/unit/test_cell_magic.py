"""%%gpu's halves without a fabric: what a cell reads and assigns, and running it."""

from __future__ import annotations

import threading

import pytest

from vramfabric.magic import reads_and_assigns, run_cell, variables_to_send


def test_reads_and_assigns_of_a_cell() -> None:
    reads, assigns = reads_and_assigns(
        "import numpy as np\ny = f(x)\ntotal += y\ndef g(): return w\nfor i in y: pass"
    )
    assert {"f", "x", "y", "total", "w"} <= reads
    assert {"np", "y", "total", "g", "i"} <= assigns


def test_only_notebook_variables_go_and_an_unsendable_one_is_named() -> None:
    ns = {"x": 1, "lock": threading.Lock(), "In": [], "unused": 2}
    assert variables_to_send("y = x + len(In)", ns, {"In"}) == {"x": 1}
    with pytest.raises(ValueError, match="variable 'lock' \\(lock\\) cannot be sent"):
        variables_to_send("with lock:\n    y = x", ns, set())
    with pytest.raises(ValueError, match="does not parse"):
        variables_to_send("y = (", ns, set())


def test_run_cell_brings_back_assigned_variables_output_and_the_error() -> None:
    out = run_cell("y = x * 2\nprint('hi', y)\nz = y / 0", {"x": 21}, ["y", "z"])
    assert out["assigned"] == {"y": 42}
    assert out["stdout"] == "hi 42\n"
    assert out["error"] is not None and "ZeroDivisionError" in out["error"][1]


def test_run_cell_names_what_cannot_come_back() -> None:
    out = run_cell("import threading\nlock = threading.Lock()\nn = 1", {}, ["lock", "n"])
    assert out["assigned"] == {"n": 1}
    assert out["unsent"] == ["lock"]
