"""Noisy neighbour: a tenant's job beside a tenant flooding its own subjects; one JSON line.

One embedded fabric with auth on (one NATS account per tenant) and two tenants: `victim`
runs the demo's 1000-configuration hyperparam search, alternately in a quiet fabric and
while `flood` (a raw nats-py client in a process of its own, logged in with its own
password) floods everything it may touch: core publishes on its work and result subjects,
JetStream publishes to its work stream, STREAM.INFO requests on its streams, and requests
and publishes whose reply subject names the victim's result subjects and inbox. Those
replies must land in the flood's account only: its operator counts them there, and the
victim's operator checks that the victim's streams hold nothing the flood sent.

    python bench/noisy_neighbour.py              # 5 quiet and 5 flooded runs of 1000 chunks
    python bench/noisy_neighbour.py --n 1000 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import numpy as np
from nats.js.api import AckPolicy, ConsumerConfig

from vramfabric.broker import auth, tenants
from vramfabric.broker.codec import decode
from vramfabric.broker.connection import Connection, connect
from vramfabric.broker.errors import VramfabricError
from vramfabric.broker.messages import ChunkResult
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import ArgMin, CoordinatorSettings, Fabric, Job
from vramfabric.demo import reference_argmin
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space
from vramfabric.local import LocalFleet, demo_tenants_file

VICTIM, FLOOD = "victim", "flood"
MARK = b"NOISY-NEIGHBOUR-FLOOD "  # in every payload the flood sends
BATCH = 256  # core publishes between flushes (a flush waits for the server to keep up)

# ---- the flood (a child process) -----------------------------------------------------------


async def _core(conn: Connection, aims: list[tuple[str, str]], stop: asyncio.Event) -> int:
    """Core publishes round (subject, reply) pairs as fast as the server takes them."""
    sent = 0
    while not stop.is_set():
        for i in range(BATCH):
            subject, reply = aims[(sent + i) % len(aims)]
            await conn.nc.publish(subject, MARK + b"core", reply=reply)
        sent += BATCH
        await conn.nc.flush()
    return sent


async def _js(conn: Connection, subject: str, stop: asyncio.Event) -> int:
    """JetStream publishes to the flood's work stream, each waiting for its ack."""
    sent = 0
    while not stop.is_set():
        await conn.js.publish(subject, MARK + b"js")
        sent += 1
    return sent


async def _api(conn: Connection, streams: list[str], stop: asyncio.Event) -> int:
    """STREAM.INFO requests on the flood's own streams, one after another."""
    sent = 0
    while not stop.is_set():
        await conn.nc.request(f"$JS.API.STREAM.INFO.{streams[sent % 3]}", b"", timeout=5.0)
        sent += 1
    return sent


def _aims(s: Any, job: str, n: int) -> list[tuple[str, str]]:
    """(subject the flood may publish to, victim subject its reply should go to) pairs."""
    own = [
        f"$JS.API.STREAM.INFO.{s.results_stream(FLOOD)}",  # JetStream answers on the reply
        s.work(FLOOD, "trick"),  # the stream's PubAck goes to the reply
    ]
    victims = [s.result(VICTIM, job, i) for i in range(n)]
    victims += [f"{s.inbox_prefix(VICTIM)}.trick{i}" for i in range(8)]
    return [(own[i % 2], v) for i, v in enumerate(victims)]


async def _flood_phase(
    conns: list[Connection], job: str, n: int, publishers: int, commands: Queue[Any]
) -> dict[str, Any]:
    """Flood until the parent says stop; the counts by kind and the seconds it ran."""
    s = conns[0].settings.subjects
    streams = [s.work_stream(FLOOD), s.results_stream(FLOOD), s.dead_stream(FLOOD)]
    stop = asyncio.Event()
    jobs: dict[str, list[Any]] = {"core": [], "js": [], "api": [], "tricks": []}
    for k in range(publishers):
        own = [s.work(FLOOD, f"f{k}")] + [s.result(FLOOD, f"f{k}", i) for i in range(1000)]
        jobs["core"].append(_core(conns[k], [(subject, "") for subject in own], stop))
    for k in range(2):
        jobs["js"].append(_js(conns[publishers + k], s.work(FLOOD, f"js{k}"), stop))
        jobs["api"].append(_api(conns[publishers + 2 + k], streams, stop))
    jobs["tricks"].append(_core(conns[-1], _aims(s, job, n), stop))
    t0, cpu0 = time.monotonic(), time.process_time()
    tasks = {kind: [asyncio.ensure_future(c) for c in cs] for kind, cs in jobs.items()}
    await asyncio.get_running_loop().run_in_executor(None, commands.get)  # "stop"
    stop.set()
    counts = {kind: sum(await asyncio.gather(*ts)) for kind, ts in tasks.items()}
    elapsed_s, cpu_s = time.monotonic() - t0, time.process_time() - cpu0
    for stream in streams[:2]:  # what the flood stored, so the next phase starts level
        await conns[0].js.purge_stream(stream)
    return {"counts": counts, "elapsed_s": elapsed_s, "cpu_s": cpu_s}


async def _flood(flood: BrokerSettings, operator: BrokerSettings, publishers: int, q: Any) -> None:
    """Connect, then one flood phase per "go" from the parent, until "quit"."""
    commands, out = q
    conns = [await connect(flood, name=f"flood{k}") for k in range(publishers + 5)]
    # The flood account's operator watches where the tricks' replies went.
    watcher = await connect(operator, name="flood-watch")
    landed = [0]

    async def count(msg: Any) -> None:
        landed[0] += 1

    await watcher.nc.subscribe(f"{flood.prefix}.result.{VICTIM}.>", cb=count)
    await watcher.nc.subscribe(f"{flood.subjects.inbox_prefix(VICTIM)}.>", cb=count)
    out.put("ready")
    while (cmd := await asyncio.get_running_loop().run_in_executor(None, commands.get))[0] == "go":
        phase = await _flood_phase(conns, cmd[1], cmd[2], publishers, commands)
        await watcher.nc.flush()
        phase["replies_in_flood_account"], landed[0] = landed[0], 0
        out.put(phase)
    for conn in [*conns, watcher]:
        await conn.close()


def flood_main(flood: BrokerSettings, operator: BrokerSettings, publishers: int, q: Any) -> None:
    """Child process: connect as the flood tenant and flood on each "go" until "quit"."""
    asyncio.run(_flood(flood, operator, publishers, q))


# ---- the victim, and the checks ----------------------------------------------------------


async def _victim_run(fabric: Fabric, n: int, job_id: str, best: tuple[int, float]) -> float:
    """One run of the demo's search; its seconds, or -1 if it failed or did not match."""
    job = Job(HYPERPARAM_EVAL, [encode_config(*c) for c in search_space(n)], job_id=job_id)
    try:
        result = await fabric.run(job, ArgMin(), slices=n, timeout_s=120)
    except VramfabricError as exc:
        print(f"victim run {job_id} failed: {exc!r}", file=sys.stderr)
        return -1.0
    value = result.value
    matched = bool(value and value[0] == best[0] and np.float32(value[1]) == np.float32(best[1]))
    # Let adverts show the released leases before the next acquire.
    await fabric.fleet.wait_changed(timeout_s=1.0)
    return result.phases_s["total_s"] if result.ok and matched else -1.0


async def _victim_streams(operator: BrokerSettings, jobs: set[str], n: int) -> dict[str, Any]:
    """As the victim account's operator, count what its streams hold that is not its own."""
    conn = await connect(operator, name="victim-check")
    s = operator.subjects
    try:
        stored = (await conn.js.stream_info(s.results_stream(VICTIM))).state.messages
        # No acks: a consumer that waits for them stops at max_ack_pending.
        sub = await conn.js.pull_subscribe(
            s.result_filter(VICTIM),
            stream=s.results_stream(VICTIM),
            config=ConsumerConfig(ack_policy=AckPolicy.NONE),
        )
        foreign = read = 0
        while read < stored:
            for msg in await sub.fetch(min(1000, stored - read), timeout=5.0):
                read += 1
                foreign += not _victims_own(msg.subject, msg.data, jobs)
        await sub.unsubscribe()
        work = await conn.js.stream_info(s.work_stream(VICTIM))
        return {
            "victim_results_stored": stored,
            "victim_results_expected": n * len(jobs),
            "victim_results_not_its_own": foreign,
            "victim_work_left": work.state.messages,
        }
    finally:
        await conn.close()


def _victims_own(subject: str, data: bytes, jobs: set[str]) -> bool:
    """Whether a message in the victim's results stream is a worker's result of its jobs."""
    job = subject.split(".")[3]
    if MARK in data or job not in jobs:
        return False
    try:
        result: ChunkResult = decode(ChunkResult, data)
    except VramfabricError:
        return False
    return result.job == job


def _alive(pid: int | None) -> bool:
    """Whether a process is running (not gone, not a zombie)."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


# ---- the bench -----------------------------------------------------------------------------


async def _runs(fleet: LocalFleet, n: int, runs: int, q: Any) -> dict[str, Any]:
    """Quiet and flooded runs, alternated; their times and the flood's phases."""
    commands, out = q
    best = reference_argmin(search_space(n))
    settings = CoordinatorSettings(slice_bytes=512 * 2**20, max_slices=n, tenant=VICTIM)
    quiet: list[float] = []
    flooded: list[float] = []
    phases: list[dict[str, Any]] = []
    jobs: set[str] = set()
    async with await Fabric.connect(fleet.broker_for(VICTIM), settings) as fabric:
        warm = f"warm{time.time_ns()}"
        jobs.add(warm)
        inputs = [encode_config(*c) for c in search_space(n)]
        await fabric.run(Job(HYPERPARAM_EVAL, inputs, job_id=warm), ArgMin(), slices=n)
        for r in range(runs):
            for kind in ("quiet", "flooded"):
                job_id = f"nn{r}{kind[0]}t{time.time_ns()}"
                jobs.add(job_id)
                if kind == "flooded":
                    commands.put(("go", job_id, n))
                    await asyncio.sleep(0.5)  # the flood at full rate before the job starts
                took = await _victim_run(fabric, n, job_id, best)
                if kind == "flooded":
                    commands.put(("stop",))
                    phases.append(await asyncio.get_running_loop().run_in_executor(None, out.get))
                (quiet if kind == "quiet" else flooded).append(took)
    return {"quiet": quiet, "flooded": flooded, "phases": phases, "jobs": jobs}


def _summary(n: int, runs: int, measured: dict[str, Any]) -> dict[str, Any]:
    """The timing and flood fields of the JSON line."""
    quiet, flooded, phases = measured["quiet"], measured["flooded"], measured["phases"]
    sent = Counter[str]()
    for p in phases:
        sent.update(p["counts"])
    flood_s = sum(p["elapsed_s"] for p in phases)
    q_med, f_med = statistics.median(quiet), statistics.median(flooded)
    return {
        "bench": "noisy_neighbour",
        "n_chunks": n,
        "runs": runs,
        "quiet_s": [round(t, 3) for t in quiet],
        "flooded_s": [round(t, 3) for t in flooded],
        "quiet_s_median": round(q_med, 4),
        "flooded_s_median": round(f_med, 4),
        "slowdown": round(f_med / q_med, 2),
        "all_ok_and_matched": min(quiet + flooded) > 0,
        "flood_msgs": dict(sent),
        "flood_msgs_per_s": round(sum(sent.values()) / flood_s),
        # CPU cores the flood's process kept busy while it flooded (of this machine's).
        "flood_cpu_cores": round(sum(p["cpu_s"] for p in phases) / flood_s, 2),
        "flood_replies_in_flood_account": sum(p["replies_in_flood_account"] for p in phases),
    }


def bench(n: int, runs: int, publishers: int, folder: str) -> dict[str, Any]:
    """Start the fabric and the flood, run, check; the JSON line's fields."""
    path = demo_tenants_file(Path(folder) / "tenants.toml", (VICTIM, FLOOD))
    password = tenants.load(path).operator.password
    fleet = LocalFleet(workers=2, simulate="4x80GiB", slice_size="512MiB", tenants_file=str(path))
    ctx = mp.get_context("spawn")
    q = (ctx.Queue(), ctx.Queue())
    fleet.start()
    try:
        flood_op = auth.settings_for(fleet.broker, auth.operator_user(FLOOD), password)
        child = ctx.Process(
            target=flood_main, args=(fleet.broker_for(FLOOD), flood_op, publishers, q), daemon=True
        )
        child.start()
        assert q[1].get(timeout=60) == "ready"
        measured = asyncio.run(_runs(fleet, n, runs, q))
        q[0].put(("quit",))
        child.join(30)
        victim_op = auth.settings_for(fleet.broker, auth.operator_user(VICTIM), password)
        line = _summary(n, runs, measured)
        line.update(asyncio.run(_victim_streams(victim_op, measured["jobs"], n)))
        server_pid = fleet.server.pid if fleet.server else None
        line["workers_alive"] = f"{sum(_alive(p.pid) for p in fleet.procs)} of {len(fleet.procs)}"
        line["server_alive"] = _alive(server_pid)
        line["server_rss_mib"] = _rss_mib(server_pid)
    finally:
        line_codes = fleet.stop()
    line["worker_exit_codes"] = line_codes
    line["flood_exit_code"] = child.exitcode
    return line


def _rss_mib(pid: int | None) -> float | None:
    """A process's resident memory in MiB, if it still runs."""
    try:
        with open(f"/proc/{pid}/status") as f:
            kib = next(int(x.split()[1]) for x in f if x.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None
    return round(kib / 1024, 1)


def main() -> int:
    """Parse flags, run the bench, print one JSON line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000, help="chunks of the victim's job")
    parser.add_argument("--runs", type=int, default=5, help="quiet and flooded runs, each")
    parser.add_argument("--publishers", type=int, default=4, help="the flood's core publishers")
    args = parser.parse_args()
    load_before = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="vramfabric-noisy-") as folder:
        line = bench(args.n, args.runs, args.publishers, folder)
    line.update(
        # Other work on the machine (this one is shared) shows here: 1-minute load averages.
        load_avg_1m=[load_before, round(os.getloadavg()[0], 2)],
        machine=f"{platform.machine()} {os.cpu_count()} cores Python {platform.python_version()}",
        date=time.strftime("%Y-%m-%d"),
    )
    print(json.dumps(line), flush=True)
    up = line["server_alive"] and set(line["worker_exit_codes"]) == {0}
    passed = line["all_ok_and_matched"] and up and line["flood_exit_code"] == 0
    return 0 if passed and line["victim_results_not_its_own"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
