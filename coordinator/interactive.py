"""GpuSession: one slice leased for an interactive block, and calls straight to its node.

`async with fabric.gpu(vram="2GiB") as gpu:` leases one slice in a lease set of its own
(labelled `_gpu_<id>` on the node, so no job, consumer or spec exists for it), renews it
while the block runs and releases it when the block ends, however it ends. `gpu.run(fn,
*args, **kwargs)` is one request-reply to the node holding the lease, which runs the call
in the lease's executor slot and answers with its outcome; at-least-once delivery stays the
batch path's job.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs

from vramfabric.broker.calls import MAX_CALL_BYTES, CallReply, CallRequest
from vramfabric.broker.errors import (
    CapacityExceeded,
    ChunkFailed,
    ChunkTimeout,
    CodeRefused,
    ErrorKind,
    LeaseExpired,
)
from vramfabric.broker.messages import Lease
from vramfabric.broker.settings import parse_size
from vramfabric.kernels.code import DEFAULT_MAX_OUTPUT_BYTES, encode_input

from .calling import (
    OnOutput,
    Printer,
    forget_work,
    send_call,
    to_own_streams,
    upload_work,
)
from .leasing import LeasePool
from .remote import apply, call_input, outcome
from .work import JobWork, job_work

if TYPE_CHECKING:
    from .fabric import Fabric

log = logging.getLogger(__name__)

# A call's own deadline on the node, unless given.
DEFAULT_CALL_TIMEOUT_S = 3600.0
# The reply may come this much after the call's deadline (the node's kill and answer).
_REPLY_MARGIN_S = 5.0


@attrs.define
class GpuSession:
    """A leased slice for interactive calls; `run` sends one call to its node."""

    fabric: Fabric
    pool: LeasePool
    work: JobWork
    lease: Lease | None = attrs.field(default=None, init=False)
    calls: int = attrs.field(default=0, init=False)
    # Where this block's calls print (calling.py).
    printer: Printer = attrs.field(factory=Printer, init=False)

    @property
    def node(self) -> str:
        """The node that holds (or held) the slice."""
        if self.lease is None:
            raise LeaseExpired("(none)")
        return self.lease.node

    async def run(
        self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> Any:
        """Run `fn(*args, **kwargs)` on the slice and return its value.

        What `fn` prints is written to this process's stdout and stderr as it prints it.

        Raises:
            Exception: what `fn` raised on the node, from a RemoteTraceback of its frames.
            TypeError: `fn` or an argument cannot be pickled, or they are too large for a call.
            LeaseExpired: the slice is no longer held (the block ended, or the node lost it).
            ChunkTimeout: the call ran past `timeout_s` (it was stopped on the node).
            CodeRefused, ChunkFailed: the node refused the call, or it failed there.
        """
        return await self.call(fn, args, kwargs, timeout_s=timeout_s)

    async def call(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        timeout_s: float | None = None,
        on_output: OnOutput = to_own_streams,
    ) -> Any:
        """`run`, with what `fn` prints handed to `on_output(stream, text)` as it prints it."""
        name = getattr(fn, "__qualname__", type(fn).__name__)
        return await self._send(self.work, call_input(fn, args, kwargs), name, timeout_s, on_output)

    async def run_work(
        self,
        work: JobWork,
        payload: Any,
        *,
        timeout_s: float | None = None,
        on_output: OnOutput = to_own_streams,
    ) -> Any:
        """Run uploaded Python work of its own (not `remote.apply`) on `payload`; its value.

        `work` is a function of (payload, ctx) returning what `remote.apply` returns, uploaded
        here (and deleted after, if this call put it there): work that carries large data
        of its own, such as a notebook run's folder.
        """
        uploaded = await upload_work(self.fabric, work)
        try:
            return await self._send(work, payload, work.name, timeout_s, on_output)
        finally:
            if uploaded:
                await asyncio.shield(forget_work(self.fabric, work))

    async def _send(
        self,
        work: JobWork,
        payload: Any,
        name: str,
        timeout_s: float | None,
        on_output: OnOutput,
    ) -> Any:
        lease = self._held()
        data = encode_input(payload)
        if len(data) > MAX_CALL_BYTES:
            raise TypeError(
                f"the call's function and arguments are {len(data)} bytes; a call carries at "
                f"most {MAX_CALL_BYTES} (pass less, or run a batch job)"
            )
        deadline_s = timeout_s or DEFAULT_CALL_TIMEOUT_S
        req = CallRequest(
            lease_id=lease.lease_id,
            name=name[:200],
            digest=work.digest,
            python=work.python,
            input=data,
            timeout_s=deadline_s,
            printed_to=self.printer.token,
        )
        wait_s = deadline_s + _REPLY_MARGIN_S
        reply = await send_call(self.fabric, lease.node, req, wait_s, self.printer, on_output)
        self.calls += 1
        if not reply.ok:
            raise _error_of(reply, lease, deadline_s)
        return outcome(reply.output or b"")

    def _held(self) -> Lease:
        if self.lease is None or self.lease.lease_id not in self.pool.leases:
            raise LeaseExpired(self.lease.lease_id if self.lease else "(none)")
        return self.lease

    async def acquire(self, wait_s: float) -> None:
        """Lease the slice, waiting up to `wait_s` for one to be free.

        Raises:
            CodeRefused: no live worker runs this Python's functions.
            CapacityExceeded: no slice was free within `wait_s`.
        """
        fleet = self.fabric.fleet
        if not any(self.work.runs_on(a) for a in fleet.adverts.values()):
            raise CodeRefused(
                f"no live worker runs Python functions on Python {self.work.python} "
                f"(of {len(fleet.adverts)} live: start workers with --allow-code)"
            )
        deadline = time.monotonic() + wait_s
        while not await self.pool.acquire(1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise CapacityExceeded(wanted=1, got=0)
            await fleet.wait_changed(timeout_s=min(left, 1.0))
        self.lease = next(iter(self.pool.leases.values()))
        self.pool.start_renewing()

    async def release(self) -> None:
        """Give the slice back (shielded: an interrupted block still releases it)."""
        await asyncio.shield(self.pool.release())
        await self.printer.close()


def _error_of(reply: CallReply, lease: Lease, timeout_s: float) -> Exception:
    kind, error = reply.error_kind or ErrorKind.ERROR, reply.error or ""
    if kind is ErrorKind.LEASE_EXPIRED:
        return LeaseExpired(lease.lease_id)
    if kind is ErrorKind.TIMEOUT:
        return ChunkTimeout(timeout_s)
    if kind is ErrorKind.CODE_REFUSED:
        return CodeRefused(error)
    return ChunkFailed(kind, error)


@asynccontextmanager
async def gpu_session(
    fabric: Fabric, vram: int | str | None = None, wait_s: float = 30.0
) -> AsyncIterator[GpuSession]:
    """Lease one slice of `vram` (bytes or "2GiB"; default the slice size) for the block."""
    slice_bytes = fabric.settings.slice_bytes if vram is None else _size(vram)
    work = await fabric.call_work()
    name = fabric.broker.subjects.interactive_job(uuid.uuid4().hex[:12])
    pool = fabric.lease_set(name, work.runs_on, slice_bytes)
    session = GpuSession(fabric, pool, work)
    try:
        await session.acquire(wait_s)
        log.info("gpu block leased node=%s lease=%s", session.node, name)
        yield session
    finally:
        await session.release()


def _size(vram: int | str) -> int:
    size = parse_size(vram) if isinstance(vram, str) else int(vram)
    if size <= 0:
        raise ValueError(f"vram must be positive, got {vram!r}")
    return size


def call_work() -> JobWork:
    """The work every interactive call runs (`remote.apply`), described for shipping.

    Its outcome may be as large as a job's output: past a message's size it comes back
    through the tenant's outputs store.
    """
    return job_work(apply, DEFAULT_MAX_OUTPUT_BYTES)
