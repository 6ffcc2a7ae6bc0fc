"""`async with fabric.gpu()`: one slice for the block, calls straight to its node, nothing left."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker.calls import MAX_CALL_INPUT_BYTES
from vramfabric.broker.errors import LeaseExpired
from vramfabric.coordinator.calls.remote import MAX_VALUE_BYTES, RemoteTraceback


def leased_bytes(agent: object) -> int:
    return agent.ledger.leased_bytes  # type: ignore[attr-defined, no-any-return]


def square_plus(x: int, plus: int = 0) -> int:
    return x * x + plus


class Odd(ValueError):
    """A user's own exception type: it comes back as itself."""


def fails(x: int) -> int:
    if x % 2:
        raise Odd(f"{x} is odd")
    return x


def slow(seconds: float) -> str:
    time.sleep(seconds)  # stands in for a long computation on the slice
    return "woke"


async def test_a_block_runs_calls_on_its_slice_and_gives_it_back(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a node that runs code and a fabric
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    # When a block leases 1 GiB and runs calls with positional and keyword arguments
    async with fabric.gpu(vram="1GiB") as gpu:
        assert leased_bytes(agent) == 2**30
        assert await gpu.run(square_plus, 7) == 49
        assert await gpu.run(square_plus, 3, plus=1) == 10
        assert await gpu.run(lambda: "a lambda") == "a lambda"
    # Then the slice is back the moment the block ends, and no job was made for it
    assert leased_bytes(agent) == 0
    assert gpu.calls == 3
    with pytest.raises(LeaseExpired):
        await gpu.run(square_plus, 1)


async def test_a_remote_exception_is_raised_as_itself_with_its_remote_traceback(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    with pytest.raises(Odd, match="3 is odd") as caught:
        async with fabric.gpu() as gpu:
            assert await gpu.run(fails, 2) == 2
            await gpu.run(fails, 3)
    cause = caught.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in fails" in cause.text and 'raise Odd(f"{x} is odd")' in cause.text
    # And the exception released the slice on its way out
    assert leased_bytes(agent) == 0


async def test_a_cancelled_call_stops_on_the_node_and_its_slice_comes_back(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a block whose call sleeps for a minute on the node
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()

    async def block() -> None:
        async with fabric.gpu() as gpu:
            await gpu.run(slow, 60)

    task = asyncio.ensure_future(block())
    await eventually(lambda: any(agent.ledger.is_busy(x.lease_id) for x in agent.ledger.holding()))
    # When the caller gives up (what Ctrl-C does to the sync facade's call)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Then the lease is released and the call's executor stopped: the VRAM is back at once
    await eventually(lambda: leased_bytes(agent) == 0, timeout_s=agent.settings.heartbeat_s * 5)


async def test_a_block_waits_for_a_slice_and_says_when_none_came(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    from vramfabric.broker.errors import CapacityExceeded

    await agent_factory("n1", simulate="1x1GiB", allow_code=True)
    fabric = await fabric_factory()
    async with fabric.gpu(vram="1GiB"):
        with pytest.raises(CapacityExceeded):
            async with fabric.gpu(vram="1GiB", wait_s=0.5):
                pass


async def test_no_worker_that_runs_code_is_refused_before_leasing(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    from vramfabric.broker.errors import CodeRefused

    agent = await agent_factory("n1", simulate="1x4GiB")
    fabric = await fabric_factory()
    with pytest.raises(CodeRefused, match="--allow-code"):
        async with fabric.gpu():
            pass
    assert leased_bytes(agent) == 0


def print_wait_print(go: str) -> str:
    """Print, wait on the node until the file `go` exists, print again (and to stderr)."""
    print("first", flush=True)
    deadline = time.monotonic() + 30
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)  # waits for the test's go-ahead, which it gives once it saw "first"
    print("second")
    print("to stderr", file=sys.stderr)
    return "done" if os.path.exists(go) else "not seen"


async def test_what_a_call_prints_reaches_the_caller_while_the_call_runs(
    agent_factory: AgentFactory, fabric_factory: FabricFactory, tmp_path: Path
) -> None:
    # Given a block, and a call that prints, then waits until the caller has seen that
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    go = tmp_path / "go"
    seen: list[tuple[str, str]] = []
    async with fabric.gpu() as gpu:
        call = asyncio.ensure_future(
            gpu.call(print_wait_print, (str(go),), {}, on_output=lambda *o: seen.append(o))
        )
        # When the caller sees the first print (the call still running), and lets it go on
        await eventually(lambda: ("stdout", "first\n") in seen)
        assert not call.done()
        go.touch()
        # Then the call ends, and everything it printed came in order, on its own stream
        assert await call == "done"
    assert "".join(t for s, t in seen if s == "stdout") == "first\nsecond\n"
    assert [t for s, t in seen if s == "stderr"] == ["to stderr\n"]


def large(n_bytes: int) -> bytes:
    return bytes(range(256)) * (n_bytes // 256)


async def test_a_value_larger_than_a_message_comes_back_and_leaves_nothing_stored(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a block on a node
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    # When a call returns 5 MiB (five times what a message carries)
    async with fabric.gpu() as gpu:
        value = await gpu.run(large, 5 * 2**20)
    # Then it came back whole, through the tenant's outputs store, which keeps none of it
    # (not even a delete marker)
    assert value == large(5 * 2**20)
    s = fabric.broker.subjects
    info = await fabric.conn.js.stream_info(s.object_stream(s.outputs_store("default")))
    assert info.state.messages == 0


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_an_argument_or_a_value_past_the_limit_is_refused_by_name(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a block on a node
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric = await fabric_factory()
    async with fabric.gpu() as gpu:
        # When a call's argument pickles past the 64 MiB a call carries
        with pytest.raises(TypeError, match=f"carries at most {MAX_CALL_INPUT_BYTES}"):
            await gpu.run(digest_of, bytes(MAX_CALL_INPUT_BYTES))
        # Then nothing of it ran or was stored, and the slice still serves calls
        assert agent.ledger.is_busy(gpu.lease.lease_id) is False  # type: ignore[union-attr]
        assert await gpu.run(digest_of, b"abc") == digest_of(b"abc")
        # And a value past what a call brings back is refused by the same name, not `apply`'s
        with pytest.raises(ValueError, match=f"brings back at most {MAX_VALUE_BYTES}"):
            await gpu.run(large, MAX_CALL_INPUT_BYTES)
        assert await gpu.run(digest_of, b"d") == digest_of(b"d")
    s = fabric.broker.subjects
    store = await fabric.conn.js.object_store(s.kernels_store("default"))
    names = [info.name for info in await store.list(ignore_deletes=True)]
    assert not [n for n in names if n.startswith("call-input-")]
