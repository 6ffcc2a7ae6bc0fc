"""Work: what a job's chunks run, as the pool hands it to an executor process.

The agent only moves these bytes (chunks/work.py fetches them): unpickling and compiling
happen in the executor (executor/work_runner.py).
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Work:
    """A job's work as an executor needs it: kind, name, digest and (uploaded code) blob."""

    kind: str
    name: str
    digest: str
    blob: bytes | None = None
