"""The node agent: GPU discovery, slice ledger, adverts, lease service and chunk execution."""

from .agent import Agent, discover
from .gpus import GpuSpec, parse_simulate, parse_size
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
