"""Placement: which nodes to ask for leases, and how many each. Pure.

A run asks only the nodes that can run its work (`JobWork.runs_on`; for a registered kernel,
`lists_kernel`), and before its first lease `refusal` says why none can, if none can.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable

from vramfabric.broker.errors import CodeRefused, KernelNotFound, PermanentError
from vramfabric.broker.messages import JobSpec, NodeAdvert

from ..settings import PLACEMENTS

# Kernel names (or Python versions) a refusal lists before it says how many more there are.
_LISTED = 20


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


def lists_kernel(advert: NodeAdvert, name: str) -> bool:
    """Whether a node runs the registered kernel `name`, as its advert says.

    An advert without a kernel list (`kernels` None: a worker of an older version) counts as
    running any, as every coordinator counted it before nodes listed their kernels: a fleet
    being upgraded keeps running its jobs, and a chunk of a kernel such a node lacks fails
    there with `kernel_not_found`, as it did before.
    """
    return advert.kernels is None or name in advert.kernels


def refusal(
    spec: JobSpec, adverts: Collection[NodeAdvert], eligible: Callable[[NodeAdvert], bool]
) -> PermanentError | None:
    """Why no live node can run the job's work, or None: one can, or none is live at all.

    Asked before a run takes its first lease, so a job that no node can run fails at once,
    naming its kernel and what the fleet has, instead of chunk by chunk. An empty fleet is
    no refusal: the run waits for nodes to join, as it always did.
    """
    if not adverts or any(eligible(a) for a in adverts):
        return None
    if spec.kernel_kind == "builtin":
        return KernelNotFound(
            spec.kernel,
            f"no live node has it; {fleet_kernels(adverts)} (start a worker with "
            "--kernel-module naming the module whose KERNELS registers it)",
        )
    what = "Python functions" if spec.kernel_kind == "python" else f"CUDA kernel {spec.kernel!r}"
    return CodeRefused(f"no live node runs {what}; {fleet_code(adverts)}")


def fleet_kernels(adverts: Collection[NodeAdvert]) -> str:
    """The registered kernels the live nodes list, with how many list each."""
    counts = Counter(k for a in adverts for k in a.kernels or ())
    return f"{_nodes(adverts)} have {_counted(counts) or 'no kernel list'}"


def fleet_code(adverts: Collection[NodeAdvert]) -> str:
    """What the live nodes say of users' code: which run it, on which Python; which simulate."""
    code = Counter(f"Python {a.python}" for a in adverts if a.allow_code)
    simulated = sum(1 for a in adverts if a.simulated)
    runs = f"{_counted(code)} run code (--allow-code)" if code else "none runs code (--allow-code)"
    return f"{_nodes(adverts)}: {runs}; {simulated} with simulated GPUs"


def _nodes(adverts: Collection[NodeAdvert]) -> str:
    return "the 1 live node" if len(adverts) == 1 else f"the {len(adverts)} live nodes"


def _counted(counts: Counter[str]) -> str:
    """`a (2), b (1)`, by name, at most _LISTED of them."""
    names = sorted(counts)
    text = ", ".join(f"{n} ({counts[n]})" for n in names[:_LISTED])
    return text + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")
