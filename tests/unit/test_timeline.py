"""The lease timeline stays bounded on a long run and keeps the curve's shape."""

from __future__ import annotations

from vramfabric.coordinator.run.timeline import MAX_POINTS, Timeline


def test_a_long_run_keeps_a_bounded_series_with_its_peak_and_its_last_point() -> None:
    # Given a run sampled 25,000 times: leases rise to one peak of 999 at sample 12,345,
    # chunks done count up
    n, peak_at = 25_000, 12_345
    ticks = iter(range(n))
    state = {"i": 0}

    def leases() -> int:
        state["i"] = next(ticks)
        return 999 if state["i"] == peak_at else state["i"] % 500

    timeline = Timeline(leases=leases, done=lambda: state["i"])
    # When every sample is taken
    for _ in range(n):
        timeline.sample()
    series = timeline.points
    # Then the series is bounded, still in time order with chunks done never going down,
    # and it still holds the peak and the newest sample
    assert len(series) <= MAX_POINTS
    assert [p[0] for p in series] == sorted(p[0] for p in series)
    assert [p[2] for p in series] == sorted(p[2] for p in series)
    assert max(p[1] for p in series) == 999
    assert series[-1][2] == n - 1
