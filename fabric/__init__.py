"""vramfabric: GPU memory as a pool of leasable VRAM slices over NATS JetStream.

The root package holds what spans both sides of the fabric: the product CLI and the local
fabric (embedded server plus worker processes). The coordinator, the worker, the broker
plumbing and the kernels are its subpackages; `from vramfabric.coordinator import Fabric, Job`
is the client API, and `vramfabric.connect()` (fabric/sync.py) its form for scripts and
notebooks. Imports stay lazy: `import vramfabric` loads no NATS client until `connect` is used.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """`connect` and the IPython extension hook, imported on first use."""
    if name == "connect":
        from .sync import connect

        return connect
    if name == "load_ipython_extension":  # `%load_ext vramfabric`
        from .magic import load_ipython_extension

        return load_ipython_extension
    raise AttributeError(f"module 'vramfabric' has no attribute {name!r}")
