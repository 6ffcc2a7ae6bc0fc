"""The lease plot: leases held and chunks done over a run (matplotlib, the `plot` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vramfabric.coordinator.run.timeline import Point


def plot_series(series: Sequence[Point], path: str | Path, title: str = "") -> Path:
    """Draw leases active (left axis) and chunks done (right axis) against time; write `path`.

    Raises:
        ImportError: matplotlib is not installed (`pip install vramfabric[plot]`).
    """
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "the lease plot needs matplotlib: pip install 'vramfabric[plot]'"
        ) from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    t = [p[0] for p in series]
    fig, leases_ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        leases_ax.step(t, [p[1] for p in series], where="post", color="tab:blue")
        leases_ax.set_xlabel("seconds since the job started")
        leases_ax.set_ylabel("leases active", color="tab:blue")
        leases_ax.set_ylim(bottom=0)
        done_ax = leases_ax.twinx()
        done_ax.plot(t, [p[2] for p in series], color="tab:orange")
        done_ax.set_ylabel("chunks done", color="tab:orange")
        done_ax.set_ylim(bottom=0)
        leases_ax.set_title(title or "leases active and chunks done")
        fig.tight_layout()
        out = Path(path)
        fig.savefig(out)
    finally:
        plt.close(fig)
    return out
