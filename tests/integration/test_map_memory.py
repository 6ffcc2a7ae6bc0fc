"""fabric.map over a generator of 100,000 items: bounded coordinator memory, early results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "map_stream.py"
# The coordinator's peak RSS for 100,000 items (51.9 MB measured; a list of the items' results
# alone would take more than this once pickled and queued).
RSS_BOUND_MB = 150


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_map_over_100k_items_stays_small_and_answers_before_its_input_ends() -> None:
    # Given the map benchmark's coordinator in a process of its own (its peak RSS is its own)
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--n", "100000"],
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # Then every item's result came back (the script checks their sum), the first one before
    # the generator was exhausted, and the coordinator's memory stayed under the bound
    assert out["n"] == 100_000
    assert out["exhausted_at_first"] is False and out["read_at_first"] < 100_000
    assert out["peak_rss_mb"] < RSS_BOUND_MB, proc.stderr[-4000:]
