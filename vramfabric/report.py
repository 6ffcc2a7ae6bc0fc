"""What the CLI shows: the live progress bar, the demo summary, job reports, adverts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from vramfabric.broker.messages import NodeAdvert
from vramfabric.coordinator.fabric import JobResult
from vramfabric.coordinator.results import ResultsConsumer

err = Console(stderr=True)


@contextmanager
def progress_bar(enabled: bool, total: int) -> Iterator[Callable[[ResultsConsumer], None] | None]:
    """A live chunks-done bar on stderr, or None when disabled."""
    if not enabled:
        yield None
        return
    columns = (
        TextColumn("chunks"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("chunks", total=total, failed=0)

        def update(results: ResultsConsumer) -> None:
            bar.update(task, completed=results.n_done, failed=results.n_failed)

        yield update


def print_demo(s: dict[str, Any]) -> None:
    """Print the demo summary `s` as readable lines."""
    cfg = s["best_config"] or {}
    print(
        f"best configuration: #{s['best_index']} learning_rate={cfg.get('learning_rate', 0):.6f} "
        f"batch_size={cfg.get('batch_size')} dropout={cfg.get('dropout', 0):.2f}"
    )
    print(
        f"best validation loss: {s['best_loss']:.6f} "
        f"({'matches' if s['matches_reference'] else 'DOES NOT MATCH'} the direct reference argmin)"
    )
    print(f"chunks: {s['ok']} ok, {s['failed']} failed of {s['configs']}")
    print(
        f"leases acquired: {s['leases_peak']} "
        f"(VRAM still leased after release: {s['leased_bytes_after']} bytes)"
    )
    print(
        f"wall time: {s['job_s']:.3f} s for the job ({s['chunks_per_s']:.0f} chunks/s), "
        f"{s['startup_s']:.2f} s to start the server and workers"
    )
    phases = ", ".join(f"{k[:-2]} {v:.3f}s" for k, v in s["phases_s"].items() if k != "total_s")
    print(f"phases: {phases}")


def report(result: JobResult) -> dict[str, Any]:
    """A job result as a JSON-ready dict (at most 10 failures)."""
    return {
        "job_id": result.job_id,
        "value": result.value,
        "ok": result.n_ok,
        "failed": result.n_failed,
        "resumed": result.resumed,
        "leases_peak": result.leases_peak,
        "phases_s": {k: round(v, 4) for k, v in result.phases_s.items()},
        "failures": [
            f"{f.index}: {f.error_kind.value if f.error_kind else 'error'}: {f.error}"
            for f in result.failures[:10]
        ],
    }


def advert_dict(a: NodeAdvert) -> dict[str, Any]:
    """A node advert as a JSON-ready dict."""
    return {
        "node": a.node,
        "sent_at": a.sent_at,
        "tenants": dict(a.tenants),
        "gpus": [
            {
                "index": g.index,
                "model": g.model,
                "total_bytes": g.total_bytes,
                "free_bytes": g.free_bytes,
                "leased_bytes": g.leased_bytes,
            }
            for g in a.gpus
        ],
    }


def jsonable(value: Any) -> Any:
    """A JSON form of what aggregates hold beside plain values (arrays, numpy scalars, bytes)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes | bytearray):
        return f"<{len(value)} bytes>"
    return repr(value)
