"""Placement: which nodes to ask for leases, and how many each. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from vramfabric.broker.messages import NodeAdvert

from .settings import PLACEMENTS


def plan(
    adverts: Iterable[NodeAdvert],
    slice_bytes: int,
    wanted: int,
    policy: str = "spread",
    exclude: frozenset[str] = frozenset(),
) -> list[tuple[str, int]]:
    """Split `wanted` leases over nodes by advertised free slices.

    `spread` gives each lease to the GPU with the most free slices in the fleet (so leases,
    and their chunks' bandwidth, spread over every GPU of every node), then asks each node
    for its GPUs' share; `pack` fills the nodes with the fewest free slices first (fewest
    nodes; whole nodes stay free). Returns (node, count) pairs with count > 0, at most
    `wanted` in total.
    """
    if policy not in PLACEMENTS:
        raise ValueError(f"unknown placement policy {policy!r}; expected 'pack' or 'spread'")
    live = [a for a in adverts if a.node not in exclude]
    if policy == "pack":
        return _pack({a.node: n for a in live if (n := a.free_slices(slice_bytes)) > 0}, wanted)
    slots = {
        (a.node, g.index): n for a in live for g in a.gpus if (n := g.free_slices(slice_bytes)) > 0
    }
    counts: dict[str, int] = {}
    for (node, _), n in sorted(_level(slots, wanted).items()):
        counts[node] = counts.get(node, 0) + n
    return [(node, n) for node, n in counts.items() if n > 0]


def _pack(free: dict[str, int], wanted: int) -> list[tuple[str, int]]:
    # Least free first: top up partly used nodes before opening empty ones.
    out: list[tuple[str, int]] = []
    for node in sorted(free, key=lambda node: (free[node], node)):
        if wanted <= 0:
            break
        take = min(free[node], wanted)
        out.append((node, take))
        wanted -= take
    return out


def _level(free: dict[tuple[str, int], int], wanted: int) -> dict[tuple[str, int], int]:
    """Take `wanted` slices off the GPUs with the most free, down to a common level.

    The same as handing out leases one at a time to the GPU with the most free slices (ties
    to the lower node name and GPU index), in O(GPUs x log(slices)) rather than O(wanted).
    """
    if wanted >= sum(free.values()):
        return dict(free)
    if wanted <= 0:
        return {}

    def above(level: int) -> int:
        return sum(max(0, n - level) for n in free.values())

    # The lowest level whose slices above it do not exceed `wanted` (above() falls as it rises).
    lo, hi = 0, max(free.values())
    while lo < hi:
        mid = (lo + hi) // 2
        if above(mid) <= wanted:
            hi = mid
        else:
            lo = mid + 1
    take = {gpu: max(0, n - lo) for gpu, n in free.items()}
    # What is left goes one each to GPUs still at the level, in name order.
    left = wanted - above(lo)
    for gpu in sorted(g for g, n in free.items() if n >= lo):
        if left == 0:
            break
        take[gpu] += 1
        left -= 1
    return take
