"""`status`, `jobs`, `job`, `cancel`, `rm` and `gc`: the fleet and a tenant's jobs."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs

from vramfabric.broker import tenants
from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection, connect
from vramfabric.broker.errors import (
    InvalidMessage,
    VramfabricError,
)
from vramfabric.broker.messages import NodeAdvert
from vramfabric.broker.settings import BrokerSettings
from vramfabric.broker.usage import AccountUsage, account_usage
from vramfabric.coordinator.jobs import joblist, lifecycle
from vramfabric.coordinator.jobs.collect import housekeep
from vramfabric.coordinator.jobs.driver import ORPHANED
from vramfabric.coordinator.jobs.failures import DEFAULT_FAILURES, Failures, read_failures
from vramfabric.coordinator.leases.fleet import held_by_job, stored_adverts
from vramfabric.coordinator.settings import CoordinatorSettings

from .exits import (
    RET_OK,
)
from .report import (
    err,
    failure_dict,
    jsonable,
    print_failures,
    print_job,
    print_jobs,
    print_status,
    status_dict,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


def cmd_status(args: argparse.Namespace) -> int:
    """Print the fleet: nodes, GPUs, slices free and leased, leases by tenant and job."""
    broker = BrokerSettings.from_env()
    adverts, held = asyncio.run(_adverts(broker))
    status = status_dict(adverts)
    # Adverts carry no job ids: the caller's own jobs' leases come from the nodes (`held`).
    by_tenant = Counter[str]()
    for a in adverts:
        by_tenant.update(a.leases)
    status.update(leases=sum(by_tenant.values()), leases_by_tenant=dict(by_tenant))
    status["leases_by_job"] = held
    policy = tenants.load_policy(args.tenants) if args.tenants else tenants.TenantPolicy()
    status["tenants"] = tenant_rows(adverts, policy)
    usage = _usage(broker, policy)
    status["usage"] = [attrs.asdict(u) for u in usage]
    if args.json:
        print(json.dumps(status))
    else:
        print_status(status)
        for u in usage:
            print(u.line())
    return RET_OK


def _usage(broker: BrokerSettings, policy: tenants.TenantPolicy) -> list[AccountUsage]:
    """Each tenant's use against its account limits: the operator's, with a tenants file."""
    if broker.user != tenants.OPERATOR_USER or not policy.tenants:
        return []
    try:
        return asyncio.run(account_usage(broker, sorted(policy.tenants)))
    except VramfabricError as exc:  # recorded: said on stderr; the rest of status stands
        err.print(f"vramfabric: tenants' account use not shown: {exc}")
        return []


def cmd_jobs(args: argparse.Namespace) -> int:
    """List the tenant's newest jobs (or all): id, kernel, state, done/failed/total, age."""
    limit = None if args.all else args.limit
    page = _lifecycle(lambda c, b, t: joblist.list_jobs(c, b, t, limit))
    now = time.time()
    if args.json:
        print(json.dumps([i.as_dict(now) for i in page.jobs], default=jsonable))
    else:
        print_jobs(list(page.jobs), now)
    if orphaned := [i.job for i in page.jobs if i.state == ORPHANED]:
        err.print(
            f"vramfabric: {len(orphaned)} job(s) orphaned (their coordinator is gone): "
            f"`vramfabric job {orphaned[-1]}` says how to resume one"
        )
    if len(page.jobs) < page.total:
        err.print(
            f"vramfabric: showing the {len(page.jobs)} most recently active of {page.total} "
            "jobs; --limit N or --all for more"
        )
    return RET_OK


def cmd_job(args: argparse.Namespace) -> int:
    """Show one job: progress, failures by kind, the aggregate if stored.

    With `--failures`, also its failed chunks: error, traceback, the end of what they printed.
    """
    if not args.failures:
        info = _lifecycle(lambda c, b, t: joblist.inspect(c, b, t, args.id))
        failed = None
    else:
        info, failed = _lifecycle(lambda c, b, t: _with_failures(c, b, t, args.id, args.limit))
    if args.json:
        out = info.as_dict(time.time())
        if failed is not None:
            out["failures"] = [failure_dict(f) for f in failed.results]
            out["failures_total"] = failed.total
        print(json.dumps(out, default=jsonable))
        return RET_OK
    print_job(info, time.time())
    if failed is not None:
        print_failures(failed.results, failed.total)
    return RET_OK


async def _with_failures(
    conn: Connection, broker: BrokerSettings, tenant: str, job: str, limit: int
) -> tuple[joblist.JobInfo, Failures]:
    """One job's info and its first `limit` failures, over one connection."""
    info = await joblist.inspect(conn, broker, tenant, job)
    spec = await joblist.read_spec(conn, broker, tenant, job)
    return info, await read_failures(conn, broker, spec, limit)


def cmd_cancel(args: argparse.Namespace) -> int:
    """Stop a job: consumer deleted, leases released by its coordinator, chunks left unrun."""
    cancelled = _lifecycle(lambda c, b, t: lifecycle.cancel(c, b, t, args.id))
    if args.json:
        print(json.dumps({"job": args.id, "cancelled": cancelled}))
    else:
        print(f"job {args.id} " + ("cancelled" if cancelled else "had already finished"))
    return RET_OK


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete a job: results, spec, record, consumer, checkpoints and outputs."""
    _lifecycle(lambda c, b, t: lifecycle.remove(c, b, t, args.id))
    print(json.dumps({"job": args.id, "removed": True}) if args.json else f"job {args.id} removed")
    return RET_OK


def cmd_gc(args: argparse.Namespace) -> int:
    """Remove jobs finished before the retention, then uploaded work no stored job names."""
    settings = CoordinatorSettings.from_env()
    retention_s = settings.job_retention_s if args.retention_s is None else args.retention_s
    done = _lifecycle(lambda c, b, t: housekeep(c, b, t, retention_s, time.time()))
    if args.json:
        print(json.dumps({"jobs": list(done.jobs), "blobs": list(done.blobs)}))
    else:
        print(f"removed {len(done.jobs)} jobs and {len(done.blobs)} uploaded blobs")
    return RET_OK


def _lifecycle(call: Callable[[Connection, BrokerSettings, str], Awaitable[T]]) -> T:
    """Run one lifecycle call for the environment's tenant over a fresh connection."""

    async def go() -> T:
        broker = BrokerSettings.from_env()
        conn = await connect(broker, name="vramfabric-cli")
        try:
            return await call(conn, broker, CoordinatorSettings.from_env().tenant)
        finally:
            await conn.close()

    return asyncio.run(go())


def tenant_rows(adverts: list[NodeAdvert], policy: tenants.TenantPolicy) -> list[dict[str, Any]]:
    """Per tenant: fleet-wide usage, quota, weight, fair share and whether it waits."""
    usage: dict[str, int] = {}
    for a in adverts:
        for tenant, n_bytes in a.tenants.items():
            usage[tenant] = usage.get(tenant, 0) + n_bytes
    waiting = {t for a in adverts for t in a.waiting}
    active = {t for t, n in usage.items() if n > 0} | waiting
    names = sorted(active | set(policy.tenants))
    capacity = sum(g.total_bytes for a in adverts for g in a.gpus if g.healthy)
    total_weight = sum(policy.weight(t) for t in active) or 1.0
    return [
        {
            "tenant": t,
            "usage_bytes": usage.get(t, 0),
            "quota_bytes": policy.quota_bytes(t),
            "weight": policy.weight(t),
            "share_bytes": int(capacity * policy.weight(t) / total_weight) if t in active else 0,
            "waiting": t in waiting,
        }
        for t in names
    ]


async def _adverts(broker: BrokerSettings) -> tuple[list[NodeAdvert], dict[str, int]]:
    """The live nodes' adverts, and the leases per `<tenant>.<job>` the caller may see.

    A tenant (auth on) sees its own jobs' only; the operator, or anyone without auth, every
    tenant's.
    """
    conn = await connect(broker, name="status")
    try:
        stored = await stored_adverts(conn, broker)
        out = []
        for node, data in sorted(stored.items()):
            try:
                out.append(decode(NodeAdvert, data))
            except InvalidMessage as exc:  # counted out, as coordinators do: the rest show
                log.warning("bad advert ignored node=%s error=%s", node, exc)
        holding = sorted({t for a in out for t, n in a.leases.items() if n})
        if broker.in_tenant_account:
            own = CoordinatorSettings.from_env().tenant
            holding = [own] if own in holding else []
        held = await held_by_job(conn, broker, holding, [a.node for a in out])
    finally:
        await conn.close()
    return out, held


def add_job_commands(sub: Any) -> None:
    """The `jobs`, `gc`, `job`, `cancel` and `rm` subcommands."""
    p = sub.add_parser("jobs", help="list jobs: id, kernel, state, done/failed/total, age")
    p.add_argument(
        "--limit",
        type=_positive_int,
        default=joblist.DEFAULT_PAGE,
        help=f"the N jobs started, finished or cancelled last (default {joblist.DEFAULT_PAGE})",
    )
    p.add_argument("--all", action="store_true", help="every job (reads every run record)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_jobs)
    p = sub.add_parser("gc", help="remove old finished jobs and uploaded work no job names")
    p.add_argument(
        "--retention-s",
        type=_seconds,
        help="remove jobs finished longer ago than this (default VRAMFABRIC_JOB_RETENTION_S, "
        "a week; 0 removes no job)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_gc)
    for name, handler, what in (
        ("job", cmd_job, "show a job's progress, failures by kind and aggregate"),
        ("cancel", cmd_cancel, "stop a job: consumer deleted, leases released, chunks unrun"),
        ("rm", cmd_rm, "delete a job's results, spec, consumer and checkpoints"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("id", help="the job id (see `vramfabric jobs`)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(handler=handler)
        if name == "job":
            p.add_argument(
                "--failures",
                action="store_true",
                help="also each failed chunk: its error, traceback and the end of what it printed",
            )
            p.add_argument(
                "--limit",
                type=_positive_int,
                default=DEFAULT_FAILURES,
                help=f"failed chunks shown with --failures (default {DEFAULT_FAILURES})",
            )


def _positive_int(text: str) -> int:
    """An integer of at least 1 (an argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _seconds(text: str) -> float:
    """A number of seconds, 0 or more (an argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, not {text}")
    return value
