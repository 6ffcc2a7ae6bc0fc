"""Turns: who comes first under contention, and how a tenant's excess is split over nodes.

When tenants outnumber slices, a share is less than a slice: rounded down it would be
nothing, and no one would be served. Instead a tenant below its share may take one slice
when it is its turn: no waiting tenant below its own share stands before it. Tenants stand
in order of VRAM held, then of recent service (worker/leases/served.py), both over their weight,
then by name; so a freed slice goes to the waiting tenant that holds least and was served
least lately. Every node orders tenants from the same adverts, so the fleet agrees (up to
an advert's lag). Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# A tenant's place: weighted bytes held, weighted recent service, name (lower comes first).
Standing = tuple[float, float, str]


def standing(tenant: str, use_bytes: float, served: float, weight: float) -> Standing:
    """Where a tenant stands in the queue for the next slice."""
    return (use_bytes / weight, served / weight, tenant)


def ahead(mine: Standing, others: Iterable[Standing]) -> list[str]:
    """The tenants of `others` that stand before `mine`."""
    return [other[2] for other in others if other < mine]


def node_part(count: int, holdings: Mapping[str, int], node: str) -> int:
    """`node`'s part of `count` slices a tenant gives back, by what each node holds of it.

    Largest remainder: each node takes the whole part of its proportional share, and the
    slices left go to the largest fractions (ties by node name). Every node computes the same
    split from the same holdings, so together they give back `count`, not one per node.
    """
    total = sum(holdings.values())
    if count <= 0 or total <= 0 or not holdings.get(node):
        return 0
    count = min(count, total)
    exact = {n: count * held / total for n, held in holdings.items() if held}
    whole = {n: int(share) for n, share in exact.items()}
    left = count - sum(whole.values())
    by_fraction = sorted(exact, key=lambda n: (-(exact[n] - whole[n]), n))
    return whole[node] + (1 if node in by_fraction[:left] else 0)
