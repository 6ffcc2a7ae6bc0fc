"""ExecutorLayout: which executor process each lease's chunks run in, by kind of work.

Python functions hold the GIL while they compute, so each lease of a function gets a lane of
its own: a process that runs that lease's chunks one after another and is kept for the
tenant's next lease on that GPU. Built-in and CUDA kernels release the GIL while the device
works, so all of a tenant's leases on a GPU share one process, a thread each (one CUDA
context per tenant and GPU, not one per lease). A tenant has at most `lanes` lanes on a GPU;
past that, leases share the least loaded lane. `isolation="process"` gives every lease a
process of its own whatever it runs.
"""

from __future__ import annotations

import collections

import attrs

from vramfabric.broker.messages import Lease

# (gpu, tenant, lease id or "" when the lease shares its tenant's process on that GPU); also
# (gpu, "", "spare") for a GPU's spare and (gpu, tenant, "idle:<pid>") for a kept idle one.
ExecKey = tuple[int, str, str]
# Third key field of a lane: a process per lease of a tenant's Python function.
LANE = "lane"
# Third key field of a process that narrows crash suspects: one chunk, then it is stopped.
ALONE = "alone:"
# The last two key fields of a GPU's spare.
SPARE = ("", "spare")
# Third key field of a lease's own process kept after its lease ended.
IDLE = "idle:"


@attrs.define
class ExecutorLayout:
    """Maps leases to executor keys and remembers the mapping while the lease lives."""

    isolation: str
    lanes: int
    _keys: dict[str, ExecKey] = attrs.field(factory=dict, init=False)
    # Leases per lane, kept as leases come and go: counting them over every lease for each
    # new one was a quarter of an agent's CPU when a job leased 160 slices at once.
    _load: collections.Counter[ExecKey] = attrs.field(factory=collections.Counter, init=False)
    # Each (GPU, tenant)'s lane keys, made once: a job leasing 160 slices asks 160 times.
    _lanes: dict[tuple[int, str], tuple[ExecKey, ...]] = attrs.field(factory=dict, init=False)

    def key_of(self, lease: Lease, kind: str) -> ExecKey:
        """The executor `lease`'s chunks of work `kind` (builtin, cuda, python) run in."""
        key = self._keys.get(lease.lease_id)
        if key is None:
            if self.isolation == "process":
                key = (lease.gpu, lease.tenant, lease.lease_id)
            elif kind != "python":
                key = (lease.gpu, lease.tenant, "")
            else:
                key = self._lane(lease)
                self._load[key] += 1
            self._keys[lease.lease_id] = key
        return key

    def _lane(self, lease: Lease) -> ExecKey:
        """The tenant's first lane on the GPU that no lease uses, else its least loaded."""
        lanes = self._lanes.get((lease.gpu, lease.tenant))
        if lanes is None:
            lanes = tuple((lease.gpu, lease.tenant, f"{LANE}{n}") for n in range(self.lanes))
            self._lanes[(lease.gpu, lease.tenant)] = lanes
        for key in lanes:
            if key not in self._load:
                return key
        return min(lanes, key=self._load.__getitem__)

    def live_keys(self, live: set[str]) -> set[ExecKey]:
        """Forget leases not in `live`; the keys the live ones use."""
        for lease_id in [i for i in self._keys if i not in live]:
            key = self._keys.pop(lease_id)
            if key in self._load:
                self._load[key] -= 1
                if not self._load[key]:
                    del self._load[key]
        return set(self._keys.values())


def alone_key(lease: Lease) -> ExecKey:
    """The key of a process that runs one suspect chunk of `lease` by itself."""
    return (lease.gpu, lease.tenant, f"{ALONE}{lease.lease_id}")


def spare_key(gpu: int) -> ExecKey:
    """The key of `gpu`'s spare executor."""
    return (gpu, *SPARE)
