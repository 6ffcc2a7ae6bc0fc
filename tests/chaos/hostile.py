"""Hostile input: malformed, truncated, wrong-type, wrong-version and oversized payloads.

`payloads(rng, valid)` mutates a valid message into garbage in the ways a broken or hostile
client would. `flood` sends them at every subject a worker or coordinator reads while a real
job runs, and `Verdict` says whether everything survived. Shared by tests/chaos/test_hostile.py
and bench/hostile.py.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import attrs
import msgpack

from tests.kernels_for_tests import SLEEPY, sleepy_input
from vramfabric.broker import (
    Chunk,
    ChunkResult,
    Connection,
    ErrorReply,
    LeaseRequest,
    ReleaseRequest,
    RenewRequest,
    buckets,
    decode,
    encode,
)
from vramfabric.broker.messages import GpuState, NodeAdvert
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator import ArgMin, CoordinatorSettings, Fabric, Job

GIB = 2**30


def _mutations(rng: random.Random) -> list[Callable[[dict[str, Any]], Any]]:
    def wrong_version(m: dict[str, Any]) -> Any:
        return {**m, "v": rng.choice([0, 2, 99, -1, "1", None])}

    def wrong_type(m: dict[str, Any]) -> Any:
        key = rng.choice(sorted(m))
        return {**m, key: rng.choice(["x", -1, 1.5, True, None, [], {}, b"\xff" * 3])}

    def missing_field(m: dict[str, Any]) -> Any:
        key = rng.choice(sorted(k for k in m if k not in ("t", "v")) or ["t"])
        return {k: v for k, v in m.items() if k != key}

    def wrong_tag(m: dict[str, Any]) -> Any:
        return {**m, "t": rng.choice(["Chunk", "LeaseGrant", "", 7, "ChunkResult"])}

    def extra_garbage(m: dict[str, Any]) -> Any:
        return {**m, **{f"k{i}": rng.random() for i in range(rng.randint(1, 5))}}

    def not_a_map(_m: dict[str, Any]) -> Any:
        return rng.choice([[1, 2, 3], "string", 42, None, [{"t": "Chunk"}]])

    return [wrong_version, wrong_type, missing_field, wrong_tag, extra_garbage, not_a_map]


def payloads(rng: random.Random, valid: bytes, max_bytes: int) -> bytes:
    """One hostile variant of `valid`: mutated, truncated, flipped, random or oversized."""
    kind = rng.randrange(6)
    if kind == 0:
        return valid[: rng.randrange(len(valid))]  # truncated
    if kind == 1:
        data = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)  # bit flips
        return bytes(data)
    if kind == 2:
        return rng.randbytes(rng.randint(0, 256))  # random bytes
    if kind == 3:
        return rng.randbytes(rng.randint(max_bytes // 2, max_bytes))  # oversized-ish garbage
    body = msgpack.unpackb(valid, raw=False)
    mutated = rng.choice(_mutations(rng))(body)
    return msgpack.packb(mutated, use_bin_type=True)  # type: ignore[no-any-return]


@attrs.define
class Verdict:
    """What a flood did and whether everything survived it."""

    sent: int = 0
    lease_requests: int = 0
    lease_error_replies: int = 0
    lease_unanswered: int = 0
    by_subject: dict[str, int] = attrs.field(factory=dict)
    rejected: int = 0
    job_ok: bool = False
    job_after_ok: bool = False
    leaked_lease_bytes: int = -1
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """Every request answered, both jobs whole, no lease left."""
        return (
            self.lease_unanswered == 0
            and self.job_ok
            and self.job_after_ok
            and self.leaked_lease_bytes == 0
        )


async def flood(
    conn: Connection,
    broker: BrokerSettings,
    nodes: list[str],
    total: int,
    seed: int = 0,
    window: int = 256,
) -> Verdict:
    """Run a job while `total` hostile messages hit every subject; then run another job."""
    rng = random.Random(seed)
    verdict = Verdict()
    t0 = time.monotonic()
    settings = CoordinatorSettings(
        slice_bytes=256 * 2**20, lease_ttl_s=3.0, ack_wait_s=2.0, max_slices=32
    )
    async with await Fabric.connect(broker, settings) as fabric:
        job = Job(SLEEPY, [sleepy_input(i) for i in range(500)], args={"sleep_s": 0.001})
        spec = job.spec(settings)
        run = asyncio.create_task(fabric.run(job, ArgMin(), slices=32, timeout_s=600))
        targets = _targets(broker, spec.job_id, spec.n_chunks, nodes)
        kv = await buckets.nodes_bucket(conn.js, broker)
        max_bytes = conn.nc.max_payload
        for start in range(0, total, window):
            batch = [rng.choice(targets) for _ in range(min(window, total - start))]
            await asyncio.gather(*(_send(conn, kv, t, rng, max_bytes, verdict) for t in batch))
        result = await run
        verdict.job_ok = result.n_ok == spec.n_chunks
        after = await fabric.run(
            Job(
                SLEEPY, [sleepy_input(i) for i in range(50)], job_id=f"after{uuid.uuid4().hex[:6]}"
            ),
            ArgMin(),
            timeout_s=120,
        )
        verdict.job_after_ok = after.n_ok == 50
        # Leases a mutated request happened to get are short: gone after their TTL.
        deadline = time.monotonic() + 10.0
        while True:
            leased = sum(g.leased_bytes for a in fabric.fleet.adverts.values() for g in a.gpus)
            if leased == 0 or time.monotonic() > deadline:
                verdict.leaked_lease_bytes = leased
                break
            await fabric.fleet.wait_changed(timeout_s=0.5)
    verdict.seconds = round(time.monotonic() - t0, 2)
    return verdict


Target = tuple[str, str, bytes]  # (kind, subject or key, a valid payload to mutate)


def _targets(broker: BrokerSettings, job: str, n_chunks: int, nodes: list[str]) -> list[Target]:
    s = broker.subjects
    out: list[Target] = []
    for node in nodes:
        lease = LeaseRequest(request_id="h1", job=job, count=2, slice_bytes=GIB, ttl_s=1.0)
        out += [
            ("lease", s.lease("default", node, "acquire"), encode(lease)),
            ("lease", s.lease("default", node, "renew"), encode(RenewRequest(("h1-0",), 1.0))),
            ("lease", s.lease("default", node, "release"), encode(ReleaseRequest(("h1-0",)))),
            ("core", s.node_advert(node), encode(_advert(node))),
        ]
    out += [
        ("js", s.work("default", job), encode(Chunk(job=job, index=1, input=sleepy_input(1)))),
        ("js", s.work("default", job), encode(Chunk(job="nosuchjob", index=1, input=b"x"))),
        (
            "js",
            s.result("default", job, n_chunks + 7),
            encode(ChunkResult(job=job, index=n_chunks + 7, ok=True)),
        ),
        ("kv", "hostile-node", encode(_advert("hostile-node"))),
    ]
    return out


def _advert(node: str) -> NodeAdvert:
    gpu = GpuState(
        index=0, model="x", total_bytes=GIB, free_bytes=GIB, leased_bytes=0, slice_bytes=GIB
    )
    return NodeAdvert(node=node, gpus=(gpu,), tenants={}, sent_at=time.time())


async def _send(
    conn: Connection, kv: Any, target: Target, rng: random.Random, max_bytes: int, verdict: Verdict
) -> None:
    kind, subject, valid = target
    data = payloads(rng, valid, max_bytes)
    if kind in ("js", "kv"):
        # Stored payloads stay small: a flood of 1 MB messages would only test the disk.
        data = data[:4096]
    verdict.sent += 1
    verdict.by_subject[kind] = verdict.by_subject.get(kind, 0) + 1
    if kind == "lease":
        verdict.lease_requests += 1
        try:
            reply = await conn.nc.request(subject, data, timeout=10)
        except Exception:
            verdict.lease_unanswered += 1
            return
        try:
            decode(ErrorReply, reply.data)
            verdict.lease_error_replies += 1
        except Exception:
            pass  # a mutation that stayed valid got a real answer
    elif kind == "core":
        await conn.nc.publish(subject, data)
    elif kind == "js":
        try:
            await conn.js.publish(subject, data)
        except Exception:
            verdict.rejected += 1  # e.g. 10077: that result subject already holds garbage
    else:
        # An advert key the fleet view must ignore when it does not decode.
        await kv.put(subject, data)


async def run_flood(total: int, seed: int = 0) -> dict[str, Any]:
    """A server, two worker processes with metrics, one flood; the verdict as a dict."""
    import urllib.request

    from vramfabric.broker import NatsServer, connect
    from vramfabric.broker.cluster import free_ports
    from vramfabric.local import LocalFleet

    server = NatsServer().start()
    prefix = f"h{uuid.uuid4().hex[:8]}"
    fleet = LocalFleet(
        workers=0,
        simulate="1x8GiB",
        slice_size="256MiB",
        prefix=prefix,
        url=server.url,
        node_ttl_s=2.0,
        worker_args=("--kernel-module", "tests.kernels_for_tests", "--heartbeat-s", "0.5"),
    )
    ports = free_ports(2)
    try:
        for i, port in enumerate(ports):
            fleet.add_worker(f"h{i}", ("--metrics-port", str(port)))
        conn = await connect(fleet.broker, name="hostile")
        try:
            verdict = await flood(conn, fleet.broker, ["h0", "h1"], total, seed)
        finally:
            await conn.close()
        alive = [proc.poll() is None for proc in fleet.procs]
        invalid = 0.0
        for port in ports:
            text = (
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
                .read()
                .decode()
            )
            invalid += sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("invalid_messages_total{")
            )
    finally:
        codes = fleet.stop()
        server.stop()
    out = attrs.asdict(verdict)
    out.update(
        passed=verdict.passed and all(alive),
        workers_alive=alive,
        worker_exit_codes=codes,
        invalid_messages_counted=invalid,
    )
    return out
