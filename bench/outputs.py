"""Large outputs end to end beside the raw object store, and replays with auth on and off.

Outputs: an embedded fabric of one simulated worker (`--allow-code`) runs jobs of one chunk
whose function returns `--mib` MiB (zeros: nothing on the path compresses), end to end from
the executor through the outputs store to the coordinator's aggregate; the same job with a
1 KiB output is the fixed cost of a job. Beside it, on the same server, the same bytes put
and got with nats-py's object store (`get(writeinto=...)`, its fast read) and with
vramfabric's own object calls (broker/objects.py). Medians of `--rounds`, alternated.

Replay: a job of `--replay` tiny chunks, one result message each, runs once and then again
(every result read back from the stream, nothing run), on a fleet with auth on (a tenants
file) and on one with auth off.

    python bench/outputs.py                      # 64 MiB, 5 rounds, a 20,000-chunk replay
    python bench/outputs.py --mib 16 --rounds 3 --replay 2000
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from vramfabric.broker.objects import chunk_bytes_for, read_object, write_object
from vramfabric.coordinator import CoordinatorSettings, Fabric, Gather, Job
from vramfabric.local import LocalFleet

MIB = 2**20
TENANTS = """
[operator]
password = "op-bench"
[workers]
password = "workers-bench"
[tenants.bench]
password = "bench-secret"
allow_code = true
"""


def zeros(n_bytes: int) -> bytes:
    """An output of `n_bytes`."""
    return bytes(n_bytes)


async def job_s(fabric: Fabric, n_bytes: int) -> float:
    """Seconds for a job of one chunk returning `n_bytes`, output checked."""
    job = Job(zeros, [n_bytes], job_id=uuid.uuid4().hex[:12], max_output_bytes=n_bytes + MIB)
    t = time.perf_counter()
    result = await fabric.run(job, Gather())
    seconds = time.perf_counter() - t
    assert result.ok and len(result.value[0]) == n_bytes, result.failures
    return seconds


async def raw_nats_py_s(fabric: Fabric, data: bytes) -> float:
    """Seconds for nats-py's object store to put and get `data` (128 KiB chunks)."""
    store = await fabric.conn.js.create_object_store(f"bench_{uuid.uuid4().hex[:8]}")
    name = uuid.uuid4().hex
    t = time.perf_counter()
    await store.put(name, data)
    sink = io.BytesIO()
    await store.get(name, writeinto=sink)
    seconds = time.perf_counter() - t
    assert sink.getbuffer().nbytes == len(data)
    await fabric.conn.js.delete_object_store(store._name)
    return seconds


async def raw_own_s(fabric: Fabric, data: bytes) -> float:
    """Seconds for vramfabric's object calls to write and read `data`."""
    bucket = f"bench_{uuid.uuid4().hex[:8]}"
    await fabric.conn.js.create_object_store(bucket)
    t = time.perf_counter()
    chunk = chunk_bytes_for(fabric.conn.nc.max_payload)
    await write_object(fabric.conn.js, bucket, "o", data, chunk)
    got = await read_object(fabric.conn.js, bucket, "o")
    seconds = time.perf_counter() - t
    assert got is not None and len(got) == len(data)
    await fabric.conn.js.delete_object_store(bucket)
    return seconds


async def outputs(mib: int, rounds: int) -> dict[str, Any]:
    """End-to-end and raw MB/s for outputs of `mib` MiB (medians of alternated rounds)."""
    n_bytes = mib * MIB
    data = bytes(n_bytes)
    fleet = LocalFleet(workers=1, simulate="1x8GiB", worker_args=("--allow-code",))
    await asyncio.to_thread(fleet.start)
    times: dict[str, list[float]] = {"job": [], "job_1kib": [], "nats_py": [], "own": []}
    try:
        settings = CoordinatorSettings(slice_bytes=512 * MIB, job_retention_s=0)
        async with await Fabric.connect(fleet.broker, settings) as fabric:
            await job_s(fabric, 1024)  # the lane's executor started, outside the timing
            for _ in range(rounds):
                times["job"].append(await job_s(fabric, n_bytes))
                times["job_1kib"].append(await job_s(fabric, 1024))
                times["nats_py"].append(await raw_nats_py_s(fabric, data))
                times["own"].append(await raw_own_s(fabric, data))
    finally:
        await asyncio.to_thread(fleet.stop)
    med = {k: statistics.median(v) for k, v in times.items()}
    mb = n_bytes / 1e6
    return {
        "output_mib": mib,
        "job_s": round(med["job"], 3),
        "job_1kib_s": round(med["job_1kib"], 3),
        "end_to_end_mb_s": round(mb / med["job"], 1),
        "end_to_end_net_mb_s": round(mb / (med["job"] - med["job_1kib"]), 1),
        "nats_py_put_get_mb_s": round(mb / med["nats_py"], 1),
        "own_write_read_mb_s": round(mb / med["own"], 1),
    }


async def replay(n_chunks: int, auth_on: bool) -> dict[str, Any]:
    """Seconds to run a job of `n_chunks` one-message chunks, and to replay it."""
    with tempfile.TemporaryDirectory() as folder:
        tenants_file = None
        if auth_on:
            tenants_file = str(Path(folder) / "tenants.toml")
            Path(tenants_file).write_text(TENANTS)
        fleet = LocalFleet(
            workers=1, simulate="1x8GiB", worker_args=("--allow-code",), tenants_file=tenants_file
        )
        await asyncio.to_thread(fleet.start)
        try:
            tenant = "bench" if auth_on else "default"
            settings = CoordinatorSettings(tenant=tenant, slice_bytes=512 * MIB)
            async with await Fabric.connect(fleet.broker_for(tenant), settings) as fabric:
                job = Job(abs, list(range(n_chunks)), chunks_per_message=1)
                t = time.perf_counter()
                first = await fabric.run(job, Gather())
                run_s = time.perf_counter() - t
                t = time.perf_counter()
                again = await fabric.run(job, Gather())
                replay_s = time.perf_counter() - t
                assert first.ok and again.ok and again.value == list(range(n_chunks))
        finally:
            await asyncio.to_thread(fleet.stop)
    return {"auth": auth_on, "run_s": round(run_s, 2), "replay_s": round(replay_s, 3)}


async def run(mib: int, rounds: int, n_replay: int) -> dict[str, Any]:
    """Both parts; the replays auth off first."""
    line: dict[str, Any] = {"bench": "outputs", **await outputs(mib, rounds)}
    if n_replay:
        cases = [await replay(n_replay, auth_on) for auth_on in (False, True)]
        line["replay_chunks"] = n_replay
        line["replays"] = cases
        line["replay_auth_ratio"] = round(cases[1]["replay_s"] / cases[0]["replay_s"], 2)
    return line


def main() -> None:
    """Parse flags, run, print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="output size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replay", type=int, default=20_000, help="chunks (0: no replay)")
    args = parser.parse_args()
    line = asyncio.run(run(args.mib, args.rounds, args.replay))
    line["machine"] = f"{platform.machine()} {os.cpu_count()} cores"
    line["date"] = time.strftime("%Y-%m-%d %H:%M")
    print(json.dumps(line))


if __name__ == "__main__":
    main()
