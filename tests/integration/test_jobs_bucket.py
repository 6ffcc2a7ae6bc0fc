"""The shared jobs bucket: made once at connect, and made again if it goes missing mid-session.

A job's spec is a publish to its key's subject (buckets.put_jobs_key), with no check of the
bucket before it: a publish no stream takes makes the bucket again and is sent once more.
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker import BrokerSettings
from vramfabric.broker.codec import decode
from vramfabric.broker.messages import JobSpec
from vramfabric.coordinator import Gather, Job

pytestmark = pytest.mark.integration


def double(x: int) -> int:
    """A tiny chunk."""
    return 2 * x


async def test_a_jobs_bucket_deleted_mid_session_is_made_again_by_the_next_job(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, broker: BrokerSettings
) -> None:
    # Given a connected fabric (its connect made the jobs bucket) and a node
    await agent_factory("n1", allow_code=True)
    fabric = await fabric_factory()
    s = broker.subjects
    stream = s.kv_stream(s.jobs_bucket())
    assert (await fabric.conn.js.stream_info(stream)).config.name == stream
    # When an operator deletes the bucket, and the user runs a job
    await fabric.conn.js.delete_stream(stream)
    result = await fabric.run(Job(double, [1, 2, 3]), Gather())
    # Then the job ran, and its spec is in the bucket made again, as the workers read it
    assert result.n_ok == 3 and sorted(result.value) == [2, 4, 6]
    kv = await fabric.conn.js.key_value(s.jobs_bucket())
    entry = await kv.get(s.job_key(fabric.settings.tenant, result.job_id))
    assert entry.value is not None
    assert decode(JobSpec, entry.value).job_id == result.job_id
    # ... with the bucket's own settings: no rollups, per-message TTLs on
    config = (await fabric.conn.js.stream_info(stream)).config
    assert config.allow_rollup_hdrs is False and config.allow_msg_ttl is True
