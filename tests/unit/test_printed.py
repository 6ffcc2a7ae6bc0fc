"""coordinator/calls/printed.py: what a call prints, framed and sent in order while it runs."""

from __future__ import annotations

import io
import sys
import threading
import time

import pytest

from tests.helpers import poll_until
from vramfabric.coordinator.calls.printed import CHUNK_CHARS, Printed, sent_while_running


def test_frames_keep_the_order_and_stream_of_what_was_written() -> None:
    # Given a call's Printed that records the frames it sends
    frames: list[bytes] = []
    printed = Printed(frames.append)
    # When text goes to stdout, stderr and stdout again, and a piece larger than a frame
    printed.write("stdout", "a")
    printed.write("stdout", "b\n")
    printed.write("stderr", "oops\n")
    printed.write("stdout", "x" * (CHUNK_CHARS + 5))
    printed.flush()
    # Then the frames say which stream, in order, each within the frame size
    assert frames[0] == b"oab\n" and frames[1] == b"eoops\n"
    assert frames[2] == b"o" + b"x" * CHUNK_CHARS and frames[3] == b"o" + b"x" * 5
    assert len(frames) == 4


def test_a_failed_send_leaves_the_call_running_and_the_text_on_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    def refuse(_frame: bytes) -> None:
        raise RuntimeError("checkpoint not stored: this chunk cannot checkpoint")

    printed = Printed(refuse)
    printed.write("stdout", "still here\n")
    printed.flush()
    assert printed.lost is not None and "cannot checkpoint" in printed.lost
    assert "still here" in capfd.readouterr().err


def test_prints_of_the_call_and_of_its_threads_are_sent_while_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the process's streams, and a call whose frames are recorded with their time
    before = io.StringIO()
    monkeypatch.setattr(sys, "stdout", before)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    frames: list[tuple[float, bytes]] = []
    with sent_while_running(lambda f: frames.append((time.monotonic(), f))):
        # When the call prints, waits, prints from a thread it starts, and to stderr
        print("first")
        assert poll_until(lambda: len(frames) == 1, timeout_s=5)
        sent_at = frames[0][0]
        worker = threading.Thread(target=print, args=("from a thread",))
        worker.start()
        worker.join()
        print("warning", file=sys.stderr)
        ended_at = time.monotonic()
    # Then the first print was sent before the call ended, and the rest when it ended
    assert sent_at < ended_at
    assert [f for _, f in frames] == [b"ofirst\n", b"ofrom a thread\n", b"ewarning\n"]
    # And after the call, prints go where they went before
    print("after")
    assert before.getvalue() == "after\n"
