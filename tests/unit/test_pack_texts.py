"""worker/chunks/pack_runner.py: a pack's failures share its result's room, each keeps its ends."""

from __future__ import annotations

from vramfabric.broker.messages import ChunkResult
from vramfabric.worker.chunks.pack_runner import _shortened


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
