"""The coordinator: leasing, jobs, aggregation and the `Fabric` API."""

from .aggregate import ArgMax, ArgMin, Collect, Fold, Gather, Mean, TopK
from .fabric import Fabric, JobResult
from .jobs import Job
from .settings import CoordinatorSettings

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
