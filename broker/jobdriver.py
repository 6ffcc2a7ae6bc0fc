"""Wire types of a job's driver: the process driving it now, and how it was started.

Values of two keys of `vf_jobs` beside the job's spec and record (docs/protocol.md, Job
drivers): `<tenant>.<job>.alive` holds the `JobDriver` heartbeat, written every beat with a
per-message TTL so that it vanishes when its process does; `<tenant>.<job>.origin` holds the
`JobOrigin` of a job started from a job file, kept, so that another process can resume it.
Like every wire type, frozen attrs classes (codec.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from .messages import PROTOCOL_VERSION
from .subjects import token

# Typed for any number: inferred from `gt(0)` it would accept int fields only.
_gt0: Callable[[Any, attrs.Attribute[Any], Any], Any] = attrs.validators.gt(0)


def _is_token(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    token(value, attr.name)


@attrs.frozen
class JobDriver:
    """The process driving a job: written every `beat_s` while it runs, gone when it is."""

    job: str = attrs.field(validator=_is_token)
    host: str
    pid: int = attrs.field(validator=_gt0)
    # Unix s: when this process started driving the job.
    started_at: float
    beat_s: float = attrs.field(validator=_gt0)
    v: int = PROTOCOL_VERSION


@attrs.frozen
class JobOrigin:
    """How a job was started: the job file (on `host`) that rebuilds it, and its log if any."""

    job: str = attrs.field(validator=_is_token)
    # The absolute path of the JOB.toml `vramfabric run` read.
    jobfile: str
    host: str
    # Where a detached coordinator writes its output ("" for a run in a terminal).
    log: str = ""
    v: int = PROTOCOL_VERSION
