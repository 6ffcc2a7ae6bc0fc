"""%%gpu's halves without a fabric: what a cell reads and assigns, and running it."""

from __future__ import annotations

import pickle
import threading

import pytest

from vramfabric.magic import _displayed, reads_and_assigns, run_cell, variables_to_send


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


def test_run_cell_brings_back_assigned_variables_and_the_error() -> None:
    out = run_cell("y = x * 2\nprint('hi', y)\nz = y / 0", {"x": 21}, ["y", "z"])
    assert {n: pickle.loads(v) for n, v in out["assigned"].items()} == {"y": 42}
    assert out["error"] is not None and "ZeroDivisionError" in out["error"][1]
    assert out["shown"] is None


def test_run_cell_names_what_cannot_come_back_and_why() -> None:
    out = run_cell("import threading\nlock = threading.Lock()\nn = 1", {}, ["lock", "n"])
    assert list(out["assigned"]) == ["n"]
    [(name, why)] = out["unsent"]
    assert name == "lock" and why.startswith("cannot be pickled: TypeError")


def test_run_cell_shows_its_last_expression_as_a_notebook_cell_does() -> None:
    # Given cells ending in an expression, a quiet one (`;`), a statement, and a value
    # that cannot travel
    shown = run_cell("y = x + 1\ny * 2", {"x": 1}, ["y"])["shown"]
    quiet = run_cell("y = 1\ny;", {}, ["y"])["shown"]
    statement = run_cell("y = 1", {}, ["y"])["shown"]
    lock = run_cell("import threading\nthreading.Lock()", {}, [])["shown"]
    # Then the last expression's value comes back, pickled, and only where a cell shows it
    assert shown is not None and shown[0] == "value" and pickle.loads(shown[1]) == 4
    assert quiet is None and statement is None
    assert lock is not None and lock[0] == "repr" and "lock" in lock[1]
    assert repr(_displayed(lock)) == lock[1]


def test_run_cell_leaves_out_values_past_the_output_limit_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a limit of 1 MiB on what a cell brings back
    monkeypatch.setattr("vramfabric.magic.MAX_BROUGHT_BACK_BYTES", 2**20)
    # When a cell assigns 600 KiB twice
    out = run_cell("a = bytes(600 * 1024)\nb = bytes(600 * 1024)", {}, ["a", "b"])
    # Then the first comes back and the second is named as too large
    assert list(out["assigned"]) == ["a"]
    [(name, why)] = out["unsent"]
    assert name == "b" and why.startswith("too large:")
