"""vramfabric: GPU memory as a pool of leasable VRAM slices over NATS JetStream.

The root package holds what spans both sides of the fabric: the product CLI and the local
fabric (embedded server plus worker processes). The coordinator, the worker, the broker
plumbing and the kernels are its subpackages; `from vramfabric.coordinator import Fabric, Job`
is the client API.
"""

__version__ = "0.1.0"
