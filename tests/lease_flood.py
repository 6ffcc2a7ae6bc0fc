"""A tenant flooding a node's lease service with renewals, in a process of its own.

    python -m tests.lease_flood --node n1 --tenant bob --ids 1000 --in-flight 600

(the broker settings, user and password from the VRAMFABRIC_* environment).

Keeps `--in-flight` renew requests of `--ids` made-up lease ids each outstanding, spread over
the `--node`s given, until it is sent SIGTERM (or `--seconds` pass); with `--raw-bytes N`
each request is N bytes of garbage instead. Then it prints one JSON line: how many were
answered, refused (by error kind: busy, invalid_message) or timed out. It runs apart from
the node under test, as a hostile client would: in one process the flood's own decoding
would slow the node it floods.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Mapping

import nats.errors

from vramfabric.broker.codec import decode, encode
from vramfabric.broker.connection import connect
from vramfabric.broker.errors import RemoteError
from vramfabric.broker.messages import RenewReply, RenewRequest
from vramfabric.broker.settings import BrokerSettings

# The line the flood prints once its requests are all in flight.
STARTED = "flood started"


async def flood(
    nodes: list[str], tenant: str, payload: bytes, in_flight: int, seconds: float
) -> Counter[str]:
    """Keep `in_flight` renewals outstanding over `nodes` until stopped; count their outcomes."""
    broker = BrokerSettings.from_env()
    conn = await connect(broker, name="flood")
    subjects = [broker.subjects.lease(tenant, node, "renew") for node in nodes]
    outcomes: Counter[str] = Counter()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.call_later(seconds, stop.set)

    async def one(subject: str) -> None:
        while not stop.is_set():
            try:
                decode(RenewReply, (await conn.nc.request(subject, payload, timeout=10)).data)
                outcomes["answered"] += 1
            except RemoteError as exc:
                outcomes[exc.remote_kind.value] += 1
            except nats.errors.TimeoutError:
                outcomes["timeout"] += 1

    tasks = [asyncio.create_task(one(subjects[i % len(nodes)])) for i in range(in_flight)]
    print(STARTED, flush=True)
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    with contextlib.suppress(Exception):  # the counts are the result, a close error is not
        await conn.close()
    return outcomes


def payload_of(ids: int, raw_bytes: int = 0) -> bytes:
    """A renewal of `ids` made-up lease ids, or `raw_bytes` of garbage when set."""
    if raw_bytes:
        return b"\xc1" * raw_bytes
    return encode(RenewRequest(tuple(f"{uuid.uuid4().hex[:12]}-{i}" for i in range(ids)), 30.0))


def start(
    env: Mapping[str, str],
    nodes: list[str],
    tenant: str,
    in_flight: int,
    ids: int = 1000,
    raw_bytes: int = 0,
) -> subprocess.Popen[str]:
    """Start a flood process with `env` (its broker settings); it floods until terminated."""
    args = [*(a for n in nodes for a in ("--node", n)), "--tenant", tenant]
    args += ["--ids", str(ids), "--raw-bytes", str(raw_bytes), "--in-flight", str(in_flight)]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.lease_flood", *args],
        env=dict(env),
        stdout=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen[str]) -> dict[str, int]:
    """Stop a flood process; what its requests came to."""
    proc.terminate()
    out, _err = proc.communicate(timeout=60)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return dict(json.loads(lines[-1])) if lines else {}


def main() -> None:
    """Parse the arguments, flood, print the outcomes."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--node", action="append", required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--ids", type=int, default=1000)
    parser.add_argument("--raw-bytes", type=int, default=0)
    parser.add_argument("--in-flight", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    payload = payload_of(args.ids, args.raw_bytes)
    outcomes = asyncio.run(flood(args.node, args.tenant, payload, args.in_flight, args.seconds))
    print(json.dumps(dict(outcomes)), flush=True)


if __name__ == "__main__":
    main()
