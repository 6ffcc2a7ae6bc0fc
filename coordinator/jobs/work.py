"""JobWork: what a Job runs, as the coordinator ships it.

A registered kernel by name, or a Python callable or CUDA kernel uploaded to the kernels
object store by digest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import nats.js.errors
from nats.js.object_store import ObjectStore

from vramfabric.broker.errors import nats_errors
from vramfabric.broker.messages import NodeAdvert
from vramfabric.kernels import Kernel
from vramfabric.kernels.code import (
    DEFAULT_MAX_OUTPUT_BYTES,
    MAX_BLOB_BYTES,
    PythonCode,
    encode_inputs,
    python_version,
)
from vramfabric.kernels.cuda import CudaKernel

from ..leases.placement import lists_kernel

log = logging.getLogger(__name__)

# What `Job.kernel` may be.
Work = Kernel | CudaKernel | Callable[..., Any]


@attrs.frozen
class JobWork:
    """A job's work on the wire: kind, name, digest, blob to upload, output dtype, input limit."""

    kind: str
    name: str
    digest: str
    output_dtype: str
    max_input_bytes: int
    blob: bytes | None = None
    python: str = ""

    def runs_on(self, advert: NodeAdvert) -> bool:
        """Whether a node would run this work rather than refuse it.

        A registered kernel needs a node that lists it (placement.lists_kernel). A function
        needs a node started with --allow-code on the same Python. A CUDA kernel on simulated
        GPUs runs its source compiled for the host CPU: native code, so it needs --allow-code
        too (any Python).
        """
        if self.kind == "builtin":
            return lists_kernel(advert, self.name)
        if self.kind == "python":
            return advert.allow_code and advert.python == self.python
        return not (self.kind == "cuda" and advert.simulated) or advert.allow_code

    def encode_inputs(self, first: int, values: Sequence[Any]) -> list[bytes]:
        """Inputs `first`, `first + 1`, ... as bytes: pickled for a callable, kernels' as given.

        Raises:
            TypeError: a kernel's input is not bytes, or a callable's is not picklable.
        """
        if self.kind == "python":
            return encode_inputs(values)
        for index, value in enumerate(values, first):
            if not isinstance(value, bytes | bytearray | memoryview):
                raise TypeError(
                    f"chunk {index}: a kernel's input must be bytes, got {type(value).__name__} "
                    "(pass a Python function to send objects)"
                )
        return [bytes(value) for value in values]


def job_work(work: Work, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> JobWork:
    """Describe a kernel, a CUDA kernel or a callable for shipping.

    Raises:
        TypeError: `work` is none of these, or a callable that cannot be pickled or pickles
            past what a node loads (MAX_BLOB_BYTES).
    """
    if isinstance(work, Kernel):
        return JobWork("builtin", work.name, work.digest, work.output_dtype, work.max_input_bytes)
    if isinstance(work, CudaKernel):
        return JobWork(
            "cuda",
            work.name,
            work.digest,
            work.output_dtype,
            work.max_input_bytes,
            blob=work.to_blob(),
            python=python_version() if work.reference is not None else "",
        )
    code = PythonCode.of(work, max_output_bytes)
    blob = code.to_blob()
    if len(blob) > MAX_BLOB_BYTES:
        # Said here, before anything is uploaded: every node would refuse it (load_failed).
        raise TypeError(
            f"{code.name} pickles to {len(blob)} bytes with the data it reads; a node loads at "
            f"most {MAX_BLOB_BYTES} (pass large data as inputs, or read it from a file)"
        )
    return JobWork(
        "python", code.name[:200], code.digest, "pickle", 2**63, blob=blob, python=python_version()
    )


async def upload(store: ObjectStore, work: JobWork) -> bool:
    """Put the work's blob in the kernels store unless it is there; True if it was put."""
    if work.blob is None:
        return False
    with nats_errors():
        try:
            await store.get_info(work.digest)
            return False
        except nats.js.errors.NotFoundError:
            pass
        await store.put(work.digest, work.blob)
    log.info(
        "work uploaded kind=%s digest=%s bytes=%d", work.kind, work.digest[:12], len(work.blob)
    )
    return True
