"""Placement: which nodes to ask for leases, and how many each. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from vramfabric.broker.messages import NodeAdvert


def plan(
    adverts: Iterable[NodeAdvert],
    slice_bytes: int,
    wanted: int,
    policy: str = "pack",
    exclude: frozenset[str] = frozenset(),
) -> list[tuple[str, int]]:
    """Split `wanted` leases over nodes by advertised free slices.

    `pack` fills the fullest-fitting nodes first (fewest nodes, whole GPUs stay free);
    `spread` deals leases round-robin so every node takes a share (more bandwidth).
    Returns (node, count) pairs with count > 0, at most `wanted` in total.
    """
    free = {
        a.node: n
        for a in adverts
        if a.node not in exclude and (n := a.free_slices(slice_bytes)) > 0
    }
    if policy == "pack":
        # Least free first: top up partly used nodes before opening empty ones.
        order = sorted(free, key=lambda node: (free[node], node))
        out: list[tuple[str, int]] = []
        for node in order:
            if wanted <= 0:
                break
            take = min(free[node], wanted)
            out.append((node, take))
            wanted -= take
        return out
    if policy != "spread":
        raise ValueError(f"unknown placement policy {policy!r}; expected 'pack' or 'spread'")
    counts = dict.fromkeys(free, 0)
    nodes = sorted(free, key=lambda node: (-free[node], node))
    while wanted > 0 and nodes:
        for node in list(nodes):
            if wanted == 0:
                break
            counts[node] += 1
            wanted -= 1
            if counts[node] == free[node]:
                nodes.remove(node)
    return [(node, n) for node, n in counts.items() if n > 0]
