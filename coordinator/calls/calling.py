"""One interactive call seen from the caller: the request, what it prints, its outcome.

A block listens on a subject of its own (`Subjects.call_printed`, a fresh token) from before
its first call's CallRequest, so nothing a call prints is missed; each CallOutput is handed
to the running call's `on_output` as it arrives (one call of a block runs at a time). The
node publishes them on the same connection as its reply, and before it, so they are all in
when the reply is. An outcome too large for a reply was put in the tenant's outputs store:
it is read from there, and deleted (a call leaves nothing stored). An input too large for a
request is put in the tenant's kernels store first (`put_input`), named in the request, and
deleted once the call has ended (`forget_input`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from vramfabric.broker import buckets
from vramfabric.broker.calls import CallOutput, CallReply, CallRequest
from vramfabric.broker.codec import decode, encode
from vramfabric.broker.errors import (
    ChunkFailed,
    ErrorKind,
    InvalidMessage,
    LeaseExpired,
    VramfabricError,
    from_nats,
    nats_errors,
)
from vramfabric.broker.objects import (
    chunk_bytes_for,
    purge_object,
    read_written_object,
    write_object,
)

from ..jobs.work import JobWork, upload

if TYPE_CHECKING:
    from ..run.runner import Runner

log = logging.getLogger(__name__)

# `on_output(stream, text)`: stream is "stdout" or "stderr".
OnOutput = Callable[[str, str], None]
# How many turns of the loop the printed frames already received may take to be handed on.
_DRAIN_TURNS = 1000


def to_own_streams(stream: str, text: str) -> None:
    """Write printed text to this process's stdout or stderr."""
    (sys.stderr if stream == "stderr" else sys.stdout).write(text)


@attrs.define
class Printer:
    """Where one block's calls print: one subscription for the block, one call at a time.

    Subscribing once per block, not per call, keeps a call's cost where it was (a subscribe
    waits for the server's answer: 0.4 ms a call, measured).
    """

    token: str = attrs.field(factory=lambda: uuid.uuid4().hex, init=False)
    _sub: Subscription | None = attrs.field(default=None, init=False)
    # The running call's `on_output`; None between calls.
    _current: OnOutput | None = attrs.field(default=None, init=False)

    @property
    def busy(self) -> bool:
        """Whether a call of this block is running."""
        return self._current is not None

    async def start(self, runner: Runner, on_output: OnOutput) -> None:
        """Hand what the next call prints to `on_output` (subscribing on the first call)."""
        if self._sub is None:
            subject = runner.broker.subjects.call_printed(runner.tenant, self.token)
            with nats_errors():
                self._sub = await runner.conn.nc.subscribe(subject, cb=self._echo)
        self._current = on_output

    async def _echo(self, msg: Msg) -> None:
        try:
            out = decode(CallOutput, msg.data)
        except VramfabricError as exc:  # recorded: logged, the call goes on
            log.warning("printed text not understood subject=%s error=%s", msg.subject, exc)
            return
        if self._current is not None:
            self._current(out.stream, out.text)

    async def drain(self) -> None:
        """Hand on what came in before the call's reply (all it printed: one connection)."""
        # `_echo` never awaits, so an empty queue means every frame in it was handed on.
        for _turn in range(_DRAIN_TURNS):
            if self._sub is None or not self._sub.pending_msgs:
                return
            await asyncio.sleep(0)

    def stop(self) -> None:
        """The call ended: hand nothing more on."""
        self._current = None

    async def close(self) -> None:
        """The block ended: stop listening."""
        sub, self._sub = self._sub, None
        if sub is None:
            return
        try:
            await sub.unsubscribe()
        except nats.errors.Error as exc:  # recorded: logged; a closed connection has no subs
            log.debug("printed subject not unsubscribed error=%s", exc)


async def send_call(
    runner: Runner,
    node: str,
    req: CallRequest,
    wait_s: float,
    printer: Printer,
    on_output: OnOutput,
) -> CallReply:
    """Send `req` to `node`; its reply (with the outcome read in), what it printed handed on.

    Raises:
        ChunkFailed: another call of the block is running (calls take turns on a slice).
        LeaseExpired: no node answers on the call's subject (the lease's node is gone).
        VramfabricError: the request or the outcome's read failed (timeout, disconnect).
    """
    if printer.busy:
        raise ChunkFailed(ErrorKind.ERROR, "the slice runs another call; calls take turns")
    await printer.start(runner, on_output)
    try:
        msg = await _request(runner, node, req, wait_s)
        await printer.drain()
    finally:
        printer.stop()
    reply = decode(CallReply, msg.data)
    if reply.ok and reply.output_ref:
        output = await _take_stored(runner, reply.output_ref)
        reply = CallReply(ok=True, output=output, node=reply.node, elapsed_s=reply.elapsed_s)
    return reply


async def _request(runner: Runner, node: str, req: CallRequest, wait_s: float) -> Msg:
    subject = runner.broker.subjects.call(runner.tenant, node)
    try:
        return await runner.conn.nc.request(subject, encode(req), timeout=wait_s)
    except nats.errors.NoRespondersError:
        raise LeaseExpired(req.lease_id) from None
    except (nats.errors.Error, TimeoutError) as exc:
        raise from_nats(exc) from None


async def _unsubscribe(sub: Subscription) -> None:
    try:
        await sub.unsubscribe()
    except nats.errors.Error as exc:  # recorded: logged; a closed connection has no subs
        log.debug("printed subject not unsubscribed error=%s", exc)


async def _take_stored(runner: Runner, name: str) -> bytes:
    """An outcome from the tenant's outputs store, deleted once read.

    Raises:
        InvalidMessage: no such object (deleted, or never stored).
    """
    broker, tenant = runner.broker, runner.tenant
    bucket = broker.subjects.outputs_store(tenant)
    data = await read_written_object(runner.conn.js, broker.call_retry, bucket, name)
    if data is None:
        raise InvalidMessage("call outcome", f"no object {name} in {bucket}")
    try:
        await purge_object(runner.conn.js, bucket, name)
    except VramfabricError as exc:  # recorded: logged (the object stays in the store)
        log.warning("call outcome not deleted object=%s error=%s", name, exc)
    return data


async def upload_work(runner: Runner, work: JobWork) -> bool:
    """Put `work` in the tenant's kernels store unless it is there; True if it was put."""
    store = await buckets.kernels_store(runner.conn.js, runner.broker, runner.tenant)
    return await upload(store, work)


async def forget_work(runner: Runner, work: JobWork) -> None:
    """Delete `work` from the tenant's kernels store (best effort: `vramfabric gc` would)."""
    try:
        bucket = runner.broker.subjects.kernels_store(runner.tenant)
        await purge_object(runner.conn.js, bucket, work.digest)
    except VramfabricError as exc:  # recorded: logged; housekeeping removes unnamed blobs
        log.warning("work not deleted digest=%s error=%s", work.digest[:12], exc)


async def put_input(runner: Runner, data: bytes) -> str:
    """Put a call's input in the tenant's kernels store under a fresh name; the name."""
    # The store is there: the block's work was uploaded to it before its first call.
    broker, tenant = runner.broker, runner.tenant
    name = broker.subjects.call_input_object(uuid.uuid4().hex)
    chunk_bytes = chunk_bytes_for(runner.conn.nc.max_payload)
    await write_object(
        runner.conn.js, broker.subjects.kernels_store(tenant), name, data, chunk_bytes
    )
    return name


async def forget_input(runner: Runner, name: str) -> None:
    """Remove a call's input from the kernels store (best effort: `vramfabric gc` would)."""
    try:
        bucket = runner.broker.subjects.kernels_store(runner.tenant)
        await purge_object(runner.conn.js, bucket, name)
    except VramfabricError as exc:  # recorded: logged; housekeeping removes unnamed blobs
        log.warning("call input not deleted object=%s error=%s", name, exc)
