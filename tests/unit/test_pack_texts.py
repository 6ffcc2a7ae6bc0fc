"""worker/chunks/pack_runner.py: a pack's failures share its result's room, each keeps its ends."""

from __future__ import annotations

from vramfabric.broker.codec import MAX_PAYLOAD_BYTES, encode
from vramfabric.broker.errors import ErrorKind
from vramfabric.broker.messages import ChunkResult
from vramfabric.broker.packs import PackResult
from vramfabric.broker.subjects import MAX_PACK_CHUNKS
from vramfabric.worker.chunks.pack_runner import (
    PACK_ERROR_CHARS,
    PACK_ERROR_CHARS_MIN,
    _shortened,
)


def failed(error: str, traceback: str, printed: str) -> ChunkResult:
    """A failed chunk's result with those texts."""
    return ChunkResult(
        job="j1", index=3, ok=False, error=error, traceback=traceback, printed=printed
    )


def test_texts_within_the_share_are_kept_whole() -> None:
    # Given a failure whose texts fit its share
    result = failed("boom", "Traceback ...\nValueError: boom", "hello\n")
    # When it is shortened for a pack's result
    # Then it is the same result
    assert _shortened(result, 1000) is result


def test_long_texts_share_the_room_and_keep_their_ends() -> None:
    # Given a failure with a long traceback and long printed text
    result = failed("ValueError: boom", "t" * 5000 + "END-OF-TRACE", "p" * 5000 + "LAST-WORDS")
    # When it is shortened to 1,000 characters in all
    short = _shortened(result, 1000)
    # Then the error is whole, the three fit together, and each cut text keeps its end
    assert short.error == "ValueError: boom"
    assert len(short.error or "") + len(short.traceback) + len(short.printed) <= 1000
    assert short.traceback.startswith("...") and short.traceback.endswith("END-OF-TRACE")
    assert short.printed.startswith("...") and short.printed.endswith("LAST-WORDS")
    # And what one does not need the other takes: with nothing printed the traceback gets it all
    alone = _shortened(failed("boom", "t" * 5000 + "END", ""), 1000)
    assert len(alone.traceback) == 1000 - len("boom")


def test_a_pack_whose_every_chunk_failed_fits_the_server_payload() -> None:
    # Given the largest pack, every chunk failed with long texts, on a node and lease with
    # ids of usual length and a job id of 64 characters
    n, job = MAX_PACK_CHUNKS, "j" * 64
    chars = max(PACK_ERROR_CHARS_MIN, PACK_ERROR_CHARS // n)
    others = tuple(
        _shortened(
            ChunkResult(
                job=job,
                index=10**9 + i,
                ok=False,
                error_kind=ErrorKind.ERROR,
                error="E" * 300,
                attempt=5,
                node="node-" + "n" * 27,
                lease_id="l" * 32,
                started_at=1.7e9,
                elapsed_s=1.234567,
                traceback="T" * 3000,
                printed="P" * 3000,
            ),
            chars,
        )
        for i in range(n)
    )
    pack = PackResult(job=job, first=10**9, outputs=(None,) * n, others=others, attempt=5)
    # Then its result, as the worker shortens it, fits the server's payload
    assert len(encode(pack)) < MAX_PAYLOAD_BYTES
