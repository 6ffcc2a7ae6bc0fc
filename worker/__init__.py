"""The node agent: GPU discovery, slice ledger, adverts, lease service and chunk execution.

The names below load on first use: an executor process imports `vramfabric.worker.executor`,
and must not pay for the agent (NATS client, metrics, every module of the node) to start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vramfabric.broker.settings import parse_size

    from .agent import Agent
    from .leases.ledger import SliceLedger
    from .node.gpus import GpuSpec, discover, parse_simulate
    from .node.settings import WorkerSettings

_WHERE = {
    "Agent": ".agent",
    "discover": ".node.gpus",
    "GpuSpec": ".node.gpus",
    "parse_simulate": ".node.gpus",
    "SliceLedger": ".leases.ledger",
    "WorkerSettings": ".node.settings",
    "parse_size": "vramfabric.broker.settings",
}

__all__ = [
    "Agent",
    "GpuSpec",
    "SliceLedger",
    "WorkerSettings",
    "discover",
    "parse_simulate",
    "parse_size",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first asked for."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)
