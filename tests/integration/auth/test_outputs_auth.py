"""Auth on: outputs through the outputs store, as a tenant reads them back."""

from __future__ import annotations

from typing import Any

from tests.helpers import eventually
from vramfabric.coordinator import Job
from vramfabric.coordinator.aggregate import Gather


def numbered_bytes(spec: tuple[int, int]) -> bytes:
    """`size` bytes that differ per chunk `index` (a swapped or missing chunk shows)."""
    index, size = spec
    pattern = index.to_bytes(4, "little") * 251
    return (pattern * (size // len(pattern) + 1))[:size]


async def test_several_outputs_of_300_kib_come_back_whole_at_once(
    agents: Any, fabrics: Any
) -> None:
    # Given a node of 6 slices that stores outputs over 16 bytes in the tenant's outputs store
    await agents("n-big", simulate="1x6GiB", inline_output_bytes=16, allow_code=True)
    alice = await fabrics("alice")
    await eventually(lambda: bool(alice.fleet.adverts))
    # When alice runs jobs of 6 chunks of 300 KiB outputs each, read back at once
    specs = [(i, 300 * 2**10) for i in range(6)]
    for _ in range(3):
        done = await alice.run(Job(numbered_bytes, specs), Gather(), slices=6, timeout_s=60)
        # Then every output comes back whole, on the first read
        assert done.ok, [f.error for f in done.failures]
        assert done.value == [numbered_bytes(s) for s in specs]

