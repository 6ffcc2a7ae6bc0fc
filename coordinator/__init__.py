"""The coordinator: leasing, jobs, aggregation and the `Fabric` API."""

from .aggregate import ArgMax, ArgMin, Collect, Fold, Gather, Mean, TopK
from .api.fabric import Fabric, JobResult
from .jobs.job import Job
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
