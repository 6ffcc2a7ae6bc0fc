"""worker/chunks/work.py and worker/executor/ipc.py: who may run what, and the executor frames."""

from __future__ import annotations

import pytest

from vramfabric.broker.messages import JobSpec
from vramfabric.kernels.code import MAX_BLOB_BYTES, python_version
from vramfabric.worker.chunks.work import refusal
from vramfabric.worker.executor import ipc


def spec(kind: str, python: str = "") -> JobSpec:
    return JobSpec(
        tenant="t", kernel="k", kernel_digest="d", n_chunks=1, kernel_kind=kind, python=python
    )


@pytest.mark.parametrize(
    ("kind", "python", "allow_code", "simulated", "refused"),
    [
        ("builtin", "", False, True, None),
        ("python", python_version(), False, True, "--allow-code"),
        ("python", python_version(), True, True, None),
        ("python", "2.7", True, False, "Python 2.7"),
        ("cuda", "", False, False, None),
        ("cuda", "", False, True, "simulates its GPUs"),
        ("cuda", "", True, True, None),
    ],
)
def test_a_node_refuses_code_it_may_not_run(
    kind: str, python: str, allow_code: bool, simulated: bool, refused: str | None
) -> None:
    why = refusal(spec(kind, python), allow_code, simulated)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in str(why)


@pytest.mark.parametrize(
    "frame",
    [
        ipc.Ready(python="3.11"),
        ipc.Load(digest="d" * 64, kind="python", blob=b"\x80\x05"),
        ipc.Run(task=3, input=b"\x00\x01", args={"a": 1.5}, job="j", index=7, attempt=2),
        ipc.Run(inputs=(b"a", b"b"), job="j", index=0, attempt=1, resumed=b"state"),
        ipc.Done(task=3, ok=True, output=b"out", cost_s=0.25),
        ipc.Done(task=3, ok=False, kind="error", error="boom", printed="p", traceback="t"),
        ipc.Checkpoint(task=3, state=b"s"),
        ipc.Checkpointed(task=3, error=None),
        ipc.LeaseEnded(leases=("l1", "l2")),
    ],
)
def test_frames_round_trip(frame: ipc.Frame) -> None:
    # Given a frame of each kind, when it is encoded, Then its header gives its length and
    # it decodes to an equal frame of the same class
    data = ipc.encode(frame)
    assert ipc.length_of(data[: ipc.HEADER_BYTES]) == len(data) - ipc.HEADER_BYTES
    assert ipc.decode(data[ipc.HEADER_BYTES :]) == frame


def test_an_oversized_frame_header_is_refused() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        ipc.length_of((ipc.MAX_FRAME_BYTES + 1).to_bytes(4, "little"))


@pytest.mark.parametrize(
    "body",
    [
        b"\x93\x01\x02\x03",  # an array
        b"\x81\xa1x\x01",  # a map without an op
        b"\x81\xa2op\xa4nope",  # an unknown op
        b"\x82\xa2op\xa4done\xa2ok\xc3",  # a done frame without its task
    ],
)
def test_a_frame_that_is_not_a_known_frame_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError, match="frame"):
        ipc.decode(body)


def test_the_largest_uploaded_work_fits_an_executor_frame() -> None:
    # A node hands a blob to an executor in one `load` frame, beside its other fields
    assert MAX_BLOB_BYTES + 2**20 <= ipc.MAX_FRAME_BYTES
