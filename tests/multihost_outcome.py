"""What a multi-host run measured (tests/multihost.py): per cut, and for the whole job.

From three sources, all on one clock (CLOCK_MONOTONIC, shared by every process on the
machine): the coordinator's report (how often, and when first, each chunk was folded), the
kernel's execution log (every execution: chunk, host, start), and the cuts (host, when cut
off, when back).
"""

from __future__ import annotations

import itertools

import attrs

from tests.multihost_job import Execution

SLICES = 8  # the job's leases: two a worker
# How long before a cut (or after the host came back) a chunk may have begun and still be
# in a host's hands: a 40 ms chunk's result and ack take well under a second even on a
# busy machine.
HELD_S = 5.0


@attrs.define
class CutReport:
    """One host cut off and brought back, and what the job went through meanwhile."""

    kind: str  # "worker" or "server"
    host: str
    at_s: float  # from the job's start
    down_s: float
    executed_at_cut: int
    # Chunks begun but not yet folded at the cut.
    in_flight: int = 0
    # Extra executions, begun after the cut, of chunks it caught (see `_caught`); and the
    # hosts where those chunks ran before.
    re_executions: int = 0
    first_ran_on: dict[str, int] = attrs.field(factory=dict)
    # Longest gap between folds from the cut to the next cut (or the job's end).
    stall_s: float = 0.0


@attrs.define
class Outcome:
    """What one multi-host run measured."""

    chunks: int
    slices: int = SLICES
    completed: bool = False
    n_ok: int = 0
    n_failed: int = 0
    lost: int = 0
    aggregated_twice: int = 0
    re_executions: int = 0
    # Extra executions no cut explains (see `_caught`), and what they were.
    unexplained_re_executions: int = 0
    unexplained: list[str] = attrs.field(factory=list)
    cuts: list[CutReport] = attrs.field(factory=list)
    total_s: float = 0.0
    coordinator_server: str = ""
    error: str = ""


@attrs.frozen
class Cut:
    """One cut as it was made: which host, when cut off and back (monotonic), executions."""

    kind: str
    host: str
    at: float
    back: float
    executed: int


def account(
    outcome: Outcome,
    report: dict[str, object],
    runs: list[Execution],
    cuts: list[Cut],
    began: float,
    hosts: dict[int, str],
) -> None:
    """Fill `outcome` from the coordinator's report, the execution log and the cuts."""
    folded = {int(k): int(v) for k, v in dict(report["folded"]).items()}  # type: ignore[call-overload]
    fold_at = {int(k): float(v) for k, v in dict(report["fold_at"]).items()}  # type: ignore[call-overload]
    outcome.n_ok, outcome.n_failed = int(report["n_ok"]), int(report["n_failed"])  # type: ignore[call-overload]
    outcome.error = str(report["error"])
    outcome.completed = outcome.n_ok == outcome.chunks and not outcome.error
    outcome.lost = outcome.chunks - len(folded)
    outcome.aggregated_twice = sum(1 for c in folded.values() if c > 1)
    times = sorted(fold_at.values())
    end = times[-1] if times else began
    outcome.total_s = round(end - began, 3)
    outcome.cuts = [_cut_report(c, began, runs, fold_at) for c in cuts]
    _attribute(outcome, runs, cuts, hosts, began)
    ends = [c.at for c in cuts[1:]] + [end]
    for cut_report, cut, until in zip(outcome.cuts, cuts, ends, strict=True):
        window = [cut.at] + [t for t in times if cut.at <= t < until]
        gaps = [b - a for a, b in itertools.pairwise(window)]
        cut_report.stall_s = round(max(gaps, default=until - cut.at), 3)


def _attribute(
    outcome: Outcome, runs: list[Execution], cuts: list[Cut], hosts: dict[int, str], began: float
) -> None:
    """Count each extra execution against the latest cut before it that caught the chunk."""
    last: dict[int, Execution] = {}
    for run in runs:
        previous = last.get(run.index)
        last[run.index] = run
        if previous is None:
            continue
        outcome.re_executions += 1
        caught = [
            i
            for i, cut in enumerate(cuts)
            if cut.at <= run.start_s and _caught(cut, previous, hosts)
        ]
        if not caught:
            outcome.unexplained_re_executions += 1
            when = f"{hosts.get(previous.netns)}@{previous.start_s - began:.3f}s"
            again = f"{hosts.get(run.netns)}@{run.start_s - began:.3f}s"
            outcome.unexplained.append(f"chunk {run.index}: {when}, again {again}")
            continue
        cut_report = outcome.cuts[caught[-1]]
        cut_report.re_executions += 1
        where = hosts.get(previous.netns, "?")
        cut_report.first_ran_on[where] = cut_report.first_ran_on.get(where, 0) + 1


def _caught(cut: Cut, previous: Execution, hosts: dict[int, str]) -> bool:
    """Whether a cut could have caught this execution's chunk in a host's hands.

    It began at most HELD_S before the cut or after the host came back (its result and ack
    were then still on their way: an ack sent while a server rejoins can be lost too), and,
    for a worker's cut, on that worker.
    """
    if not cut.at - HELD_S <= previous.start_s <= cut.back + HELD_S:
        return False
    return cut.kind == "server" or hosts.get(previous.netns) == cut.host


def _cut_report(
    cut: Cut, began: float, runs: list[Execution], fold_at: dict[int, float]
) -> CutReport:
    begun = {run.index for run in runs if run.start_s <= cut.at}
    in_flight = sum(1 for i in begun if fold_at.get(i, float("inf")) > cut.at)
    return CutReport(
        kind=cut.kind,
        host=cut.host,
        at_s=round(cut.at - began, 3),
        down_s=round(cut.back - cut.at, 3),
        executed_at_cut=cut.executed,
        in_flight=in_flight,
    )


def as_json(outcome: Outcome) -> dict[str, object]:
    """The outcome as a JSON-ready dict."""
    return attrs.asdict(outcome)
