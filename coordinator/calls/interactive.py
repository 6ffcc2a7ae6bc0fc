"""GpuSession: one slice leased for an interactive block, and calls straight to its node.

`async with fabric.gpu(vram="2GiB") as gpu:` leases one slice in a lease set of its own
(labelled `_gpu_<id>` on the node, so no job, consumer or spec exists for it), renews it
while the block runs and releases it when the block ends, however it ends. `gpu.run(fn,
*args, **kwargs)` is one request-reply to the node holding the lease, which runs the call
in the lease's executor slot and answers with its outcome; at-least-once delivery stays the
batch path's job.

Kicked out and put back: a node takes a block's slice back when it ran no call for the
operator's idle time, or for the fair share; the block's next call leases a slice again
(waiting if it must, and saying so) and is sent there. A call the node refused because the
lease had ended ran nothing, so it is sent again once on the new slice.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs

from vramfabric.broker.calls import MAX_CALL_BYTES, MAX_CALL_INPUT_BYTES, CallReply, CallRequest
from vramfabric.broker.errors import (
    ChunkFailed,
    ChunkTimeout,
    CodeRefused,
    ErrorKind,
    LeaseExpired,
)
from vramfabric.broker.messages import Lease
from vramfabric.broker.settings import parse_size
from vramfabric.kernels.code import DEFAULT_MAX_OUTPUT_BYTES, encode_input

from ..jobs.work import JobWork, job_work
from ..leases.leasing import LeasePool
from .calling import (
    OnOutput,
    Printer,
    forget_input,
    forget_work,
    put_input,
    send_call,
    to_own_streams,
    upload_work,
)
from .remote import apply, call_input, outcome
from .slice_wait import SliceWait, wait_for_slice

if TYPE_CHECKING:
    from ..run.runner import Runner

log = logging.getLogger(__name__)

# A call's own deadline on the node, unless given.
DEFAULT_CALL_TIMEOUT_S = 3600.0
# The reply may come this much after the call's deadline (the node's kill and answer).
_REPLY_MARGIN_S = 5.0


def to_stderr(line: str) -> None:
    """Show a waiting line on stderr, rewritten in place (a carriage return) as it changes."""
    sys.stderr.write(line)
    sys.stderr.flush()


@attrs.define
class GpuSession:
    """A leased slice for interactive calls; `run` sends one call to its node."""

    runner: Runner
    pool: LeasePool
    work: JobWork
    # How long a lease waits for a free slice (None: until one is free, or Ctrl-C).
    wait_s: float | None = None
    # Where a wait for a slice is shown: a line, rewritten as the queue moves.
    say: Callable[[str], None] = to_stderr
    lease: Lease | None = attrs.field(default=None, init=False)
    # The block ended: its slice was given back for good, and calls fail.
    ended: bool = attrs.field(default=False, init=False)
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
        uploaded = await upload_work(self.runner, work)
        try:
            return await self._send(work, payload, work.name, timeout_s, on_output)
        finally:
            if uploaded:
                await asyncio.shield(forget_work(self.runner, work))

    async def _send(
        self,
        work: JobWork,
        payload: Any,
        name: str,
        timeout_s: float | None,
        on_output: OnOutput,
    ) -> Any:
        data = encode_input(payload)
        if len(data) > MAX_CALL_INPUT_BYTES:
            raise TypeError(
                f"the call's function and arguments are {len(data)} bytes pickled; a call "
                f"carries at most {MAX_CALL_INPUT_BYTES} (pass less, or run a batch job)"
            )
        deadline_s = timeout_s or DEFAULT_CALL_TIMEOUT_S
        # Past a message's size the input goes through the kernels store, once for both sends.
        ref = await put_input(self.runner, data) if len(data) > MAX_CALL_BYTES else ""
        try:
            sent = (b"", ref) if ref else (data, "")
            lease, reply = await self._call_once(work, sent, name, deadline_s, on_output)
            if not reply.ok and reply.error_kind is ErrorKind.LEASE_EXPIRED and not reply.started:
                # Taken back before this block heard of it: nothing ran. Lease a slice again
                # (`_held`), and send the call there.
                self.pool.leases.pop(lease.lease_id, None)
                lease, reply = await self._call_once(work, sent, name, deadline_s, on_output)
        finally:
            if ref:
                await asyncio.shield(forget_input(self.runner, ref))
        self.calls += 1
        if not reply.ok:
            raise _error_of(reply, lease, deadline_s)
        return outcome(reply.output or b"")

    async def _call_once(
        self,
        work: JobWork,
        sent: tuple[bytes, str],
        name: str,
        deadline_s: float,
        on_output: OnOutput,
    ) -> tuple[Lease, CallReply]:
        """Send the call once; `sent` is its input, or the name of the object holding it."""
        lease = await self._held()
        req = CallRequest(
            lease_id=lease.lease_id,
            name=name[:200],
            digest=work.digest,
            python=work.python,
            input=sent[0],
            timeout_s=deadline_s,
            printed_to=self.printer.token,
            input_ref=sent[1],
        )
        wait_s = deadline_s + _REPLY_MARGIN_S
        reply = await send_call(self.runner, lease.node, req, wait_s, self.printer, on_output)
        return lease, reply

    async def _held(self) -> Lease:
        """The block's lease; if a node took it back, a new one (waiting as `acquire` does)."""
        if self.lease is not None and self.lease.lease_id in self.pool.leases:
            return self.lease
        if self.ended:
            raise LeaseExpired(self.lease.lease_id if self.lease else "(none)")
        self.lease = None
        await self.acquire(again=True)
        assert self.lease is not None  # acquire returns only holding one
        return self.lease

    async def acquire(self, again: bool = False) -> None:
        """Lease the slice, waiting up to `wait_s` for one to be free, showing the wait.

        Raises:
            CodeRefused: no live worker runs this Python's functions.
            SliceTooLarge: no GPU of those workers is as large as the slice.
            CapacityExceeded: no slice was free within `wait_s`.
        """
        await wait_for_slice(
            self.pool, self.runner.fleet, self.work, SliceWait(self.wait_s, self.say, again)
        )
        self.lease = next(iter(self.pool.leases.values()))
        if not again:
            self.pool.start_renewing()

    async def release(self) -> None:
        """Give the slice back (shielded: an interrupted block still releases it)."""
        self.ended = True
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
    runner: Runner,
    vram: int | str | None = None,
    wait_s: float | None = None,
    say: Callable[[str], None] = to_stderr,
) -> AsyncIterator[GpuSession]:
    """Lease one slice of `vram` (bytes or "2GiB"; default the slice size) for the block."""
    slice_bytes = runner.settings.slice_bytes if vram is None else _size(vram)
    if wait_s is not None and wait_s < 0:
        raise ValueError(f"wait_s must be 0 or more (None: until a slice is free), got {wait_s}")
    work = call_work()
    await runner.ship(work)
    name = runner.broker.subjects.interactive_job(uuid.uuid4().hex[:12])
    pool = runner.lease_set(name, work.runs_on, slice_bytes)
    session = GpuSession(runner, pool, work, wait_s, say)
    try:
        await session.acquire()
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
