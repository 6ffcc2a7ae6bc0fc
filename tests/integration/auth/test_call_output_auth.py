"""What a call prints, and an outcome past a message's size, with auth on: to its tenant only."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.authsetup import AuthFabric
from tests.helpers import eventually
from tests.integration.test_gpu_block import large, print_wait_print
from vramfabric.broker.errors import PermissionDenied


async def test_a_call_prints_to_its_tenant_and_returns_5_mib_with_auth_on(
    auth_fabric: AuthFabric, connections: Any, agents: Any, fabrics: Any, tmp_path: Any
) -> None:
    # Given alice in a block on a node, with auth on, and bob, who may not listen where
    # alice's calls print, listening where his own would
    s = auth_fabric.base.subjects
    await agents("n-printed", simulate="1x4GiB", allow_code=True)
    alice = await fabrics("alice")
    bob = await connections(auth_fabric.tenant("bob"))
    overheard: list[bytes] = []

    async def overhear(msg: Any) -> None:
        overheard.append(msg.data)

    with pytest.raises(PermissionDenied):
        await bob.nc.subscribe(s.call_printed_filter("alice"), cb=overhear)
    await bob.nc.subscribe(s.call_printed_filter("bob"), cb=overhear)
    go = tmp_path / "go"
    seen: list[tuple[str, str]] = []
    async with alice.gpu() as gpu:
        # When her call prints, waits until she has seen it, and prints again
        call = asyncio.ensure_future(
            gpu.call(print_wait_print, (str(go),), {}, on_output=lambda *o: seen.append(o))
        )
        await eventually(lambda: ("stdout", "first\n") in seen)
        go.touch()
        # Then what it printed reached her while it ran, and bob heard none of it
        assert await call == "done"
        # And a 5 MiB outcome comes back to her through her outputs store
        assert await gpu.run(large, 5 * 2**20) == large(5 * 2**20)
    assert "".join(t for _, t in seen) == "first\nsecond\nto stderr\n"
    await bob.nc.flush()
    assert overheard == []
