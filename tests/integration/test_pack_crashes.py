"""A packed chunk that crashes or hangs its executor is charged alone: its pack-mates are not.

Tiny chunks travel many to a message (a pack). One that ends its executor, or runs past its
deadline, must not cost the others of its pack a delivery; it gets its own retries, as a
chunk of its own would, and only it spends them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker import BrokerSettings, Connection, ErrorKind, RetryPolicy, decode
from vramfabric.broker.messages import ChunkResult
from vramfabric.broker.packs import PackResult
from vramfabric.coordinator import Job
from vramfabric.coordinator.aggregate import Gather

CRASHES, CRASHES_TWICE, HANGS = 13, 27, 41
RETRY = RetryPolicy(max_retries=2, initial_backoff_s=0.1, max_backoff_s=0.2)


def troublesome(item: tuple[int, str]) -> int:
    """Ends its executor on 13 (every time) and 27 (its first two runs); hangs on 41."""
    x, folder = item
    if x == CRASHES:
        os._exit(1)  # an executor that dies under the chunk
    if x == CRASHES_TWICE:
        runs = Path(folder) / "crashes"
        with runs.open("a") as f:
            f.write("x")
        if len(runs.read_text()) <= 2:
            os._exit(1)
    if x == HANGS:
        time.sleep(600)  # a chunk that never ends (its deadline kills it)
    return x


async def attempts_stored(conn: Connection, broker: BrokerSettings, job_id: str) -> dict[int, int]:
    """The attempt each chunk's stored result names (a packed output: its pack's attempt)."""
    s = broker.subjects
    stream = s.results_stream("default")
    info = await conn.js.stream_info(stream, subjects_filter=s.result_filter("default", job_id))
    attempts: dict[int, int] = {}
    for subject in info.state.subjects or {}:
        msg = await conn.js.get_last_msg(stream, subject)
        assert msg.data is not None
        if subject.count(".") == 5:  # a pack's result: <first>.<last>
            pack = decode(PackResult, msg.data)
            for index, out in enumerate(pack.outputs, pack.first):
                if out is not None:
                    attempts[index] = pack.attempt
            attempts.update({r.index: r.attempt for r in pack.others})
        else:
            result = decode(ChunkResult, msg.data)
            attempts[result.index] = result.attempt
    return attempts


async def test_a_crashing_or_hanging_packed_chunk_alone_spends_deliveries(
    conn: Connection,
    broker: BrokerSettings,
    agent_factory: AgentFactory,
    fabric_factory: FabricFactory,
    tmp_path: Path,
) -> None:
    # Given a node that runs code, and 60 chunks packed 20 to a message, 2 retries each, a
    # 1.5 s deadline: chunk 13 ends its executor every time, 27 its first two runs (in its
    # pack, then alone), 41 hangs
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory(ack_wait_s=5.0)
    inputs = [(i, str(tmp_path)) for i in range(60)]
    job = Job(troublesome, inputs, chunks_per_message=20, retry=RETRY, timeout_s=1.5)
    # When it runs
    result = await fabric.run(job, Gather(), slices=2, timeout_s=120)
    # Then 13 failed as a crash and 41 as a timeout, each on its last attempt (it alone spent
    # the retries), and every other chunk succeeded, 27 on its second attempt (a retry)
    failed = {f.index: (f.error_kind, f.attempt) for f in result.failures}
    assert failed == {CRASHES: (ErrorKind.CRASHED, 3), HANGS: (ErrorKind.TIMEOUT, 3)}
    assert result.n_ok == 58
    assert result.value == [x if x not in failed else None for x in range(60)]
    # And the stored results show no extra delivery for any healthy chunk: all on attempt 1
    attempts = await attempts_stored(conn, broker, result.job_id)
    assert attempts.pop(CRASHES_TWICE) == 2
    assert (attempts.pop(CRASHES), attempts.pop(HANGS)) == (3, 3)
    assert attempts == dict.fromkeys(set(range(60)) - {CRASHES, CRASHES_TWICE, HANGS}, 1)
