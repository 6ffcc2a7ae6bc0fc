"""worker/chunks/work.py: a node's cache of uploaded code keeps to its count and its bytes."""

from __future__ import annotations

import hashlib

import pytest

from vramfabric.broker.messages import JobSpec
from vramfabric.worker.chunks import work
from vramfabric.worker.chunks.work import WorkLoader


def spec_of(digest: str) -> JobSpec:
    return JobSpec(
        tenant="t1",
        kernel="f",
        kernel_digest=digest,
        n_chunks=1,
        kernel_kind="python",
        python="3.11",
    )


async def test_the_blob_cache_keeps_to_its_bytes_the_newest_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given three blobs of 60, 60 and 30 bytes and a cache of 100 bytes
    blobs = {hashlib.sha256(b).hexdigest(): b for b in (b"a" * 60, b"b" * 60, b"c" * 30)}
    reads: list[str] = []

    async def read(_tenant: str, digest: str) -> bytes | None:
        reads.append(digest)
        return blobs.get(digest)

    monkeypatch.setattr(work, "MAX_CACHED_BLOB_BYTES", 100)
    loader = WorkLoader(read)
    a, b, c = blobs
    # When each is loaded in turn, then the last two again
    for digest in (a, b, c, b, c):
        assert (await loader.work_of(spec_of(digest))).blob == blobs[digest]
    # Then the first went when the second came (120 bytes), and the last two stayed (90)
    assert reads == [a, b, c]
    # And one larger than the whole cache is still kept, alone, as the newest
    big = b"d" * 150
    blobs[hashlib.sha256(big).hexdigest()] = big
    for digest in (*blobs, c):
        await loader.work_of(spec_of(digest))
    assert reads == [a, b, c, a, b, c, hashlib.sha256(big).hexdigest(), c]
