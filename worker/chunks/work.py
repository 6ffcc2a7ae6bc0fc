"""Work: what a job's chunks run, and the node's cache of uploaded code by digest.

Built-in kernels are named; Python callables and CUDA kernels come from the kernels object
store by sha256, fetched once per node and kept in memory. The agent only moves these bytes:
unpickling and compiling happen in executor processes. Before a job runs, the node checks
that it may run the job's code at all.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import attrs

from vramfabric.broker.connection import Connection
from vramfabric.broker.errors import CodeRefused, KernelLoadFailed, nats_errors
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.objects import read_written_object
from vramfabric.broker.settings import BrokerSettings
from vramfabric.kernels.code import MAX_BLOB_BYTES, python_version

from ..executors.work import Work

log = logging.getLogger(__name__)

# Blobs kept in memory per node, and their bytes (least recently used go first; the one
# just fetched stays whatever its size).
MAX_CACHED_BLOBS = 64
MAX_CACHED_BLOB_BYTES = 2**30


@functools.lru_cache(maxsize=256)
def _builtin(name: str, digest: str) -> Work:
    """A registered kernel's work (one object per kernel, not one per chunk)."""
    return Work("builtin", name, digest)


def refusal(
    spec: JobSpec, allow_code: bool, simulated: bool, tenant_may: bool = True, contained: str = ""
) -> CodeRefused | None:
    """Why this node must not run the job's code, or None if it may.

    `tenant_may` is the tenants file's word on the job's tenant (the tenant comes from
    the subject the job's leases were asked on, never from the spec's payload). `contained`
    is the containment's refusal ("" when tenants' code may run: worker/executors/containment.py).
    """
    # A CUDA kernel on simulated GPUs runs its source compiled for this CPU: native code.
    users_code = spec.kernel_kind == "python" or (spec.kernel_kind == "cuda" and simulated)
    if users_code and not tenant_may:
        return CodeRefused(
            f"tenant {spec.tenant} may not run code on this fabric's CPUs "
            "(allow_code is not set for it in the tenants file)"
        )
    if users_code and not allow_code:
        if spec.kernel_kind == "python":
            why = "this worker does not run Python functions"
        else:
            why = (
                "this worker simulates its GPUs, so it runs a CUDA kernel's source compiled "
                "for its CPU, and it does not run users' code"
            )
        return CodeRefused(f"{why} (it was started without --allow-code)")
    if users_code and contained:
        return CodeRefused(contained)
    if spec.kernel_kind == "python" and spec.python != python_version():
        return CodeRefused(
            f"the job's function was pickled on Python {spec.python or '?'}; this worker "
            f"runs Python {python_version()}"
        )
    return None


# (tenant, digest): a blob is cached per tenant, so one tenant cannot run another's code
# by naming its digest.
BlobKey = tuple[str, str]


@attrs.define
class WorkLoader:
    """Fetches uploaded code by digest from its tenant's kernels store, once per node."""

    # (tenant, digest) -> the blob, or None if the tenant's store does not hold it.
    read_blob: Callable[[str, str], Awaitable[bytes | None]]
    _blobs: OrderedDict[BlobKey, bytes] = attrs.field(factory=OrderedDict, init=False)
    _fetching: dict[BlobKey, asyncio.Task[bytes]] = attrs.field(factory=dict, init=False)

    async def work_of(self, spec: JobSpec) -> Work:
        """The job's work, its blob fetched if it is uploaded code.

        Raises:
            KernelLoadFailed: the blob is missing or does not match its digest.
            Disconnected: the store could not be reached (transient).
        """
        if spec.kernel_kind == "builtin":
            return _builtin(spec.kernel, spec.kernel_digest)
        key = (spec.tenant, spec.kernel_digest)
        blob = self._blobs.get(key)
        if blob is None:
            task = self._fetching.get(key)
            if task is None:
                task = asyncio.get_running_loop().create_task(self._fetch(key))
                self._fetching[key] = task
                task.add_done_callback(lambda _t: self._fetching.pop(key, None))
            blob = await asyncio.shield(task)
        if key in self._blobs:  # another fetch may have evicted it while this one waited
            self._blobs.move_to_end(key)
        return Work(spec.kernel_kind, spec.kernel, spec.kernel_digest, blob)

    async def _fetch(self, key: BlobKey) -> bytes:
        tenant, digest = key
        try:
            with nats_errors():
                found = await self.read_blob(tenant, digest)
        except ValueError as exc:  # its meta is over the limit, or its chunks do not match it
            raise KernelLoadFailed(f"kernel blob {digest[:12]}: {exc}") from None
        if found is None:
            raise KernelLoadFailed(f"kernel blob {digest[:12]} is not in the store")
        data = bytes(found)
        if hashlib.sha256(data).hexdigest() != digest:
            raise KernelLoadFailed(f"kernel blob {digest[:12]} does not match its digest")
        self._blobs[key] = data
        cached = sum(map(len, self._blobs.values()))
        while len(self._blobs) > 1 and (
            len(self._blobs) > MAX_CACHED_BLOBS or cached > MAX_CACHED_BLOB_BYTES
        ):
            cached -= len(self._blobs.popitem(last=False)[1])
        log.info("kernel blob fetched digest=%s bytes=%d", digest[:12], len(data))
        return data


def blob_reader(
    conn: Connection, broker: BrokerSettings
) -> Callable[[str, str], Awaitable[bytes | None]]:
    """Reads a tenant's uploaded code by digest from its kernels store (in its account)."""

    async def read(tenant: str, digest: str) -> bytes | None:
        bucket = broker.subjects.kernels_store(tenant)
        js, retry = conn.tenant_js(tenant), broker.call_retry
        # A larger one could not reach an executor: refused from its meta, rather than read
        # whole into this agent's memory.
        return await read_written_object(js, retry, bucket, digest, MAX_BLOB_BYTES)

    return read
