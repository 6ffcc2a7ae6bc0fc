"""The coordinator: leasing, jobs, aggregation and the `Fabric` API.

The names below load on first use: an executor process that runs an interactive call
unpickles `vramfabric.coordinator.calls.remote.apply`, which needs this package, not the
NATS client and the rest of the API (importing them made a fresh fabric's first call take
0.8 s on a 2-core machine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .aggregate import ArgMax, ArgMin, Collect, Fold, Gather, Mean, TopK
    from .api.fabric import Fabric, JobResult
    from .jobs.job import Job
    from .settings import CoordinatorSettings

_WHERE = {
    "ArgMax": ".aggregate",
    "ArgMin": ".aggregate",
    "Collect": ".aggregate",
    "CoordinatorSettings": ".settings",
    "Fabric": ".api.fabric",
    "Fold": ".aggregate",
    "Gather": ".aggregate",
    "Job": ".jobs.job",
    "JobResult": ".api.fabric",
    "Mean": ".aggregate",
    "TopK": ".aggregate",
}

__all__ = [
    "ArgMax",
    "ArgMin",
    "Collect",
    "CoordinatorSettings",
    "Fabric",
    "Fold",
    "Gather",
    "Job",
    "JobResult",
    "Mean",
    "TopK",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first asked for."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)
