"""Bare JetStream, the floor the benches compare the fabric with (compare.py, batched.py).

A work-queue stream of payloads, worker processes pulling from it and publishing one result
each into a results stream, and a client that publishes a job's payloads under a fresh tag
and takes the results as they come. No leases, retries, idempotency or failure handling.
What a worker computes is the bench's: `make_compute()` is called once in each worker
process (a picklable callable, such as a module-level function or a partial of one) and
returns the function applied to each payload.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

Compute = Callable[[bytes], bytes]


def _worker(
    url: str, ready: Any, prefix: str, make_compute: Callable[[], Compute], fetch: int
) -> None:
    """A worker process: pull payloads, compute, publish each result."""
    asyncio.run(_worker_loop(url, ready, prefix, make_compute(), fetch))


async def _worker_loop(url: str, ready: Any, prefix: str, compute: Compute, fetch: int) -> None:
    nc = await nats.connect(url)
    sub = await nc.jetstream().pull_subscribe_bind("w", stream=f"{prefix.upper()}_WORK")
    ready.set()
    while True:
        try:
            msgs = await sub.fetch(fetch, timeout=1.0)
        except TimeoutError:  # nothing queued: ask again
            continue
        for msg in msgs:
            tag, index = msg.subject.split(".")[2:4]
            await nc.publish(f"{prefix}.res.{tag}.{index}", compute(msg.data))
            await msg.ack()


class Floor:
    """Streams named for `prefix`, `workers` pulling processes, and a client."""

    def __init__(
        self, url: str, prefix: str, make_compute: Callable[[], Compute], fetch: int, workers: int
    ) -> None:
        """Nothing starts until `start`; each worker fetches up to `fetch` payloads at once."""
        self.url, self.prefix, self.fetch, self.workers = url, prefix, fetch, workers
        self.make_compute = make_compute
        self.procs: list[mp.process.BaseProcess] = []

    async def start(self) -> None:
        """Streams, consumer and worker processes; returns once the workers pull."""
        self.nc = await nats.connect(self.url)
        js = self.nc.jetstream()
        work, p = f"{self.prefix.upper()}_WORK", self.prefix
        await js.add_stream(
            StreamConfig(name=work, subjects=[f"{p}.work.>"], retention=RetentionPolicy.WORK_QUEUE)
        )
        await js.add_stream(StreamConfig(name=f"{p.upper()}_RES", subjects=[f"{p}.res.>"]))
        await js.add_consumer(
            work,
            ConsumerConfig(durable_name="w", ack_policy=AckPolicy.EXPLICIT, max_ack_pending=-1),
        )
        ctx = mp.get_context("spawn")
        events = [ctx.Event() for _ in range(self.workers)]
        args = [(self.url, e, p, self.make_compute, self.fetch) for e in events]
        self.procs = [ctx.Process(target=_worker, args=a, daemon=True) for a in args]
        for proc in self.procs:
            proc.start()
        for event in events:
            await asyncio.to_thread(event.wait)

    async def run(self, payloads: Sequence[bytes], on_result: Callable[[int, bytes], None]) -> None:
        """Publish the payloads under a fresh tag; `on_result(index, result)` as each comes."""
        tag = uuid.uuid4().hex[:12]
        left = len(payloads)
        done = asyncio.Event()

        async def take(msg: Any) -> None:
            nonlocal left
            on_result(int(msg.subject.rsplit(".", 1)[1]), msg.data)
            left -= 1
            if not left:
                done.set()

        sub = await self.nc.subscribe(f"{self.prefix}.res.{tag}.*", cb=take)
        for i, payload in enumerate(payloads):
            await self.nc.publish(f"{self.prefix}.work.{tag}.{i}", payload)
        await self.nc.flush()
        await done.wait()
        await sub.unsubscribe()

    async def stop(self) -> None:
        """Stop the workers and the client."""
        for proc in self.procs:
            proc.terminate()
        await self.nc.close()
