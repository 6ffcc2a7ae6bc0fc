"""The node agent: GPU discovery, slice ledger, adverts, lease service and chunk execution."""

from vramfabric.broker.settings import parse_size

from .agent import Agent, discover
from .gpus import GpuSpec, parse_simulate
from .ledger import SliceLedger
from .settings import WorkerSettings

__all__ = [
    "Agent",
    "GpuSpec",
    "SliceLedger",
    "WorkerSettings",
    "discover",
    "parse_simulate",
    "parse_size",
]
