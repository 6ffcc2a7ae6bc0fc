"""What the CLI shows: the live progress bar, the demo summary, job reports, adverts."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from vramfabric.broker.messages import ChunkResult, NodeAdvert
from vramfabric.coordinator.api.fabric import JobResult
from vramfabric.coordinator.jobs.joblist import JobInfo
from vramfabric.coordinator.run.results import ResultsConsumer

# Messages on stderr: one line each however narrow the terminal or pipe (rich wraps at 80
# columns when it cannot tell the width), and printed as given: exception text such as
# "[cuda] ..." is not rich markup.
err = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)


class RateColumn(ProgressColumn):
    """Chunks per second over rich's recent window."""

    def render(self, task: Task) -> Text:
        """The rate, or a dash before there is one."""
        speed = task.finished_speed or task.speed
        return Text("-- chunks/s" if speed is None else f"{speed:,.0f} chunks/s")


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
        RateColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("chunks", total=total, failed=0)

        def update(results: ResultsConsumer) -> None:
            bar.update(task, completed=results.n_done, failed=results.n_failed)

        yield update


def print_demo(s: dict[str, Any]) -> None:
    """The demo's summary as text."""
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
    """A job result as a dict of plain values (for text and JSON output)."""
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


def print_run(s: dict[str, Any]) -> None:
    """A job report (from `report`) as text: plain values, one fact per line."""
    print(f"job: {s['job_id']}")
    print(f"value: {json.dumps(s['value'], default=jsonable)}")
    resumed = f" ({s['resumed']} from an earlier run)" if s["resumed"] else ""
    print(f"chunks: {s['ok']} ok, {s['failed']} failed{resumed}")
    print(f"leases peak: {s['leases_peak']}")
    phases = ", ".join(f"{k.removesuffix('_s')} {v:.3f}s" for k, v in s["phases_s"].items())
    print(f"phases: {phases}")
    for line in s["failures"]:
        print(f"failed chunk {line}")
    if s["failed"] > len(s["failures"]):
        more = s["failed"] - len(s["failures"])
        print(f"... and {more} more failed chunks (vramfabric job {s['job_id']})")


def advert_dict(a: NodeAdvert) -> dict[str, Any]:
    """A node advert as a dict of plain values."""
    return {
        "node": a.node,
        "sent_at": a.sent_at,
        "containment": a.containment,
        "tenants": dict(a.tenants),
        "jobs": dict(a.jobs),
        "gpus": [
            {
                "index": g.index,
                "model": g.model,
                "total_bytes": g.total_bytes,
                "free_bytes": g.free_bytes,
                "leased_bytes": g.leased_bytes,
                "healthy": g.healthy,
                "problem": g.problem,
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


def print_jobs(infos: list[JobInfo], now: float) -> None:
    """One line per job: id, kernel, state, done/failed/total, age."""
    if not infos:
        print("no jobs")
        return
    print(f"{'JOB':<18} {'KERNEL':<24} {'STATE':<10} {'DONE/FAILED/TOTAL':>20} {'AGE':>8}")
    for i in infos:
        failed = "?" if i.n_failed is None else i.n_failed  # a running job's are not counted
        counts = f"{i.n_done}/{failed}/{i.n_chunks}"
        age = _age(now - i.started_at) if i.started_at else "-"
        print(f"{i.job:<18} {i.kernel[:24]:<24} {i.state:<10} {counts:>20} {age:>8}")


def print_job(info: JobInfo, now: float) -> None:
    """One job's progress, failures by kind, and aggregate."""
    pct = 100.0 * info.n_done / max(info.n_chunks, 1)
    print(f"job {info.job} ({info.tenant}): {info.state}, kernel {info.kernel}")
    print(f"progress: {info.n_done}/{info.n_chunks} chunks ({pct:.1f}%), {info.n_failed} failed")
    if info.started_at:
        print(f"started {_age(now - info.started_at)} ago")
    for kind, n in sorted(info.failures_by_kind.items()):
        print(f"  failed {kind}: {n}")
    if info.value is not None:
        print(f"aggregate: {json.dumps(info.value)}")
    if info.coordinator:
        print(f"coordinator: {info.coordinator}")
    if info.resume:
        print(f"coordinator gone; resume with: {info.resume}")
    if info.log:
        print(f"log: {info.log}")


def failure_dict(f: ChunkResult) -> dict[str, Any]:
    """A failed chunk's result as plain values: its error, traceback and what it printed."""
    return {
        "index": f.index,
        "error_kind": f.error_kind.value if f.error_kind else "error",
        "error": f.error,
        "attempt": f.attempt,
        "node": f.node,
        "lease_id": f.lease_id,
        "traceback": f.traceback,
        "printed": f.printed,
    }


def print_failures(failures: tuple[ChunkResult, ...], total: int) -> None:
    """Each failed chunk: kind, attempt and node, its error, traceback and printed text."""
    for f in failures:
        kind = f.error_kind.value if f.error_kind else "error"
        where = f" on {f.node}" if f.node else ""
        print(f"\nfailed chunk {f.index}: {kind}, attempt {f.attempt}{where}")
        print(_indented(f.error or ""))
        if f.traceback and f.traceback.strip() != (f.error or "").strip():
            print("  traceback:")
            print(_indented(f.traceback, 4))
        if f.printed:
            print(f"  printed (the last {len(f.printed.encode()):,} bytes):")
            print(_indented(f.printed.rstrip("\n"), 4))
    if total > len(failures):
        print(f"\n... and {total - len(failures)} more failed chunks (--limit N shows more)")


def _indented(text: str, by: int = 2) -> str:
    return "\n".join(" " * by + line for line in text.splitlines())


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def status_dict(adverts: list[NodeAdvert]) -> dict[str, Any]:
    """The fleet in numbers: nodes, GPUs, slices free and leased, leases by tenant and job.

    Slices are each GPU's own (its advert's `slice_bytes`), not any client's setting.
    """
    leases_by_job: dict[str, int] = {}
    for a in adverts:
        for key, n in a.jobs.items():
            leases_by_job[key] = leases_by_job.get(key, 0) + n
    tenants: dict[str, int] = {}
    for key, n in leases_by_job.items():
        tenant = key.split(".", 1)[0]
        tenants[tenant] = tenants.get(tenant, 0) + n
    return {
        "nodes": [advert_dict(a) for a in adverts],
        "n_nodes": len(adverts),
        "n_gpus": sum(len(a.gpus) for a in adverts),
        "slice_bytes": sorted({g.slice_bytes for a in adverts for g in a.gpus}),
        "slices_free": sum(g.free_slices(g.slice_bytes) for a in adverts for g in a.gpus),
        "leases": sum(leases_by_job.values()),
        "leased_bytes": sum(g.leased_bytes for a in adverts for g in a.gpus),
        "leases_by_tenant": tenants,
        "leases_by_job": leases_by_job,
        # `node/index` -> why (an older worker's unhealthy GPU says nothing: "unhealthy").
        "unhealthy_gpus": {
            f"{a.node}/{g.index}": g.problem or "unhealthy"
            for a in adverts
            for g in a.gpus
            if not g.healthy
        },
    }


def print_status(s: dict[str, Any]) -> None:
    """The fleet summary, then one line per node."""
    if not s["nodes"]:
        print("no live nodes")
        return
    print(
        f"{s['n_nodes']} node(s), {s['n_gpus']} GPU(s): {s['slices_free']} slices of "
        f"{' or '.join(f'{b / 2**20:.0f}' for b in s['slice_bytes'])} MiB free, "
        f"{s['leases']} leased"
    )
    for node in s["nodes"]:
        free = sum(g["free_bytes"] for g in node["gpus"])
        leased = sum(g["leased_bytes"] for g in node["gpus"])
        sick = sum(1 for g in node["gpus"] if not g["healthy"])
        print(
            f"  {node['node']}: {len(node['gpus'])} GPU(s), {free / 2**30:.1f} GiB free, "
            f"{leased / 2**30:.1f} GiB leased"
            + (f", {sick} unhealthy" if sick else "")
            + (f", executors {node['containment']}" if node["containment"] else "")
        )
    for key, n in sorted(s["leases_by_job"].items()):
        print(f"  leases of {key}: {n}")
    for gpu, problem in sorted(s["unhealthy_gpus"].items()):
        print(f"  unhealthy GPU {gpu}: {problem} (takes no leases)")
    for r in s.get("tenants", ()):
        quota = "-" if r["quota_bytes"] is None else f"{r['quota_bytes'] / 2**30:.1f} GiB"
        print(
            f"  tenant {r['tenant']}: {r['usage_bytes'] / 2**30:.1f} GiB used, quota {quota}, "
            f"share {r['share_bytes'] / 2**30:.1f} GiB (weight {r['weight']:g})"
            + (", waiting" if r["waiting"] else "")
        )
