"""CallService: interactive calls on `vf.call.<tenant>.<node>`, run in the lease's slot.

A `fabric.gpu()` block sends each call straight here by request-reply. The tenant comes from
the subject (the server's permissions, and with accounts the tenant's one import, guard
it), and a call runs only on a live lease of that same tenant: a lease id is not a secret.
The call runs in the lease's executor like a chunk (the agent never runs users' code), its
slot held while it runs; its answer is the reply. What it prints comes in from the executor
on the call's checkpoint channel (a call has no checkpoints of its own) and goes straight on
to the caller's `printed_to` subject. An outcome too large for a reply goes to the tenant's
outputs store, named in the reply; the caller reads and deletes it. An input too large for
a request comes from the tenant's kernels store, named in the request. A call whose lease is
released or expires while it runs is stopped (its executor killed), so the VRAM comes back
at once, not when the function ends.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterator

import attrs
from nats.aio.msg import Msg

from vramfabric.broker.calls import MAX_CALL_BYTES, CallOutput, CallReply, CallRequest
from vramfabric.broker.codec import decode, encode
from vramfabric.broker.errors import (
    ChunkFailed,
    ErrorKind,
    InvalidMessage,
    LeaseExpired,
    VramfabricError,
    nats_errors,
)
from vramfabric.broker.messages import JobSpec, Lease
from vramfabric.broker.stopping import stop_tasks
from vramfabric.broker.subjects import Subjects

from ..executor import ipc
from ..executors.outcomes import SaveCheckpoint
from ..node.metrics import WorkerMetrics
from .runner import ChunkRunner
from .work import refusal

log = logging.getLogger(__name__)

# The stream a frame of printed text names in its first byte (coordinator/calls/printed.py).
_STREAMS = {b"o": "stdout", b"e": "stderr"}
# Job specs of calls kept at most (`CallService._spec_of`); then forgotten all at once.
_SPECS_KEPT = 256


@attrs.define
class CallService:
    """Serves one node's interactive calls on its leases' executors."""

    subjects: Subjects
    runner: ChunkRunner
    metrics: WorkerMetrics
    simulated: bool
    # Calls running now, by lease id: stopped when their lease ends.
    _running: dict[str, asyncio.Task[bytes]] = attrs.field(factory=dict, init=False)
    # Every call being served: each in a task of its own, so one long call on a node does
    # not hold back the calls on its other leases.
    _serving: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)
    # Numbers the outcomes stored in outputs stores (object `<lease job>.<n>`).
    _stored: Iterator[int] = attrs.field(factory=itertools.count, init=False)
    # The job specs of recent calls (`_spec_of`): a block's calls all have the same one, and
    # checking a spec's fields each call cost a no-op call a tenth of this agent's time.
    _specs: dict[tuple[str, str, str, str, str, float | None], JobSpec] = attrs.field(
        factory=dict, init=False
    )

    async def dispatch(self, msg: Msg) -> None:
        """Serve one call in a task of its own (the subscription's callback)."""
        task = asyncio.get_running_loop().create_task(self.handle(msg))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def stop(self) -> None:
        """Stop every call being served (the node is stopping)."""
        # Until each has ended: a reply's publish may swallow a cancel (broker/stopping.py).
        await stop_tasks(self._serving)

    async def handle(self, msg: Msg) -> None:
        """Answer one call; a bad one gets a failed CallReply naming why."""
        t0 = time.time()
        if not msg.reply or not self.subjects.is_inbox(msg.reply):
            # Answering would publish, with this agent's rights, where the asker chose.
            self.metrics.invalid("call.reply")
            log.warning("call refused: reply %r is not an inbox", msg.reply)
            return
        try:
            tenant, node = self.subjects.parse_call(msg.subject)
            if node != self.runner.node:
                raise InvalidMessage("call subject", f"addressed to node {node!r}")
            req = decode(CallRequest, msg.data)
            lease, output = await self._run(tenant, req)
            reply = await self._replied(tenant, lease, output, t0)
        except (InvalidMessage, ValueError) as exc:
            self.metrics.invalid("call")
            reply = self._failed(ErrorKind.INVALID_MESSAGE, str(exc), t0)
        except LeaseExpired as exc:  # not a live lease here: nothing of the call ran
            reply = self._failed(exc.kind, str(exc), t0, started=False)
        except ChunkFailed as exc:
            reply = self._failed(exc.error_kind, str(exc), t0)
        except VramfabricError as exc:  # refused, timed out, crashed, lease gone: the reply says
            reply = self._failed(exc.kind, str(exc), t0)
        except asyncio.CancelledError:
            if self._stopping():
                raise
            # Its lease ended under it (released, expired): the caller hears why.
            reply = self._failed(ErrorKind.LEASE_EXPIRED, "the lease ended during the call", t0)
        await msg.respond(encode(reply))

    @staticmethod
    def _stopping() -> bool:
        """Whether this handler itself is cancelled (not only the call it awaited)."""
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    def _failed(self, kind: ErrorKind, error: str, t0: float, started: bool = True) -> CallReply:
        return CallReply(
            ok=False,
            error_kind=kind,
            error=error[:4000],
            node=self.runner.node,
            elapsed_s=time.time() - t0,
            started=started,
        )

    async def _replied(self, tenant: str, lease: Lease, output: bytes, t0: float) -> CallReply:
        """The reply carrying `output`, or naming its object in the tenant's outputs store."""
        if len(output) <= MAX_CALL_BYTES:
            return CallReply(
                ok=True, output=output, node=self.runner.node, elapsed_s=time.time() - t0
            )
        # Bounded by the call work's max_output_bytes, which the executor enforces.
        ref = await self.runner.store.put_output(tenant, lease.job, next(self._stored), output)
        return CallReply(ok=True, output_ref=ref, node=self.runner.node, elapsed_s=time.time() - t0)

    async def _run(self, tenant: str, req: CallRequest) -> tuple[Lease, bytes]:
        """Run the call in its lease's slot; return the lease and the output.

        Raises:
            LeaseExpired: the lease is not a live lease of this tenant here.
            CodeRefused: this node (or the tenants file) does not run the tenant's code.
            VramfabricError: the call failed, timed out or its executor crashed.
        """
        runner = self.runner
        lease = runner.ledger.get(req.lease_id)
        if (
            lease is None
            or lease.tenant != tenant
            or not self.subjects.is_interactive(lease.job)
            or not runner.ledger.is_live(lease.lease_id, time.monotonic())
        ):
            raise LeaseExpired(req.lease_id)
        if req.lease_id in self._running:
            raise ChunkFailed(ErrorKind.ERROR, "the lease runs another call; calls take turns")
        spec = self._spec_of(tenant, lease, req)
        code_ok, contained = runner.policy.allows_code(tenant), runner.pool.containment
        refused = refusal(
            spec, runner.settings.allow_code, self.simulated, code_ok, contained.code_refusal
        )
        if refused is not None:
            raise refused
        printer = self._printer(tenant, req)
        task = asyncio.get_running_loop().create_task(self._execute(spec, lease, req, printer))
        self._running[lease.lease_id] = task
        try:
            output = await task
        finally:
            self._running.pop(lease.lease_id, None)
        return lease, output

    def _printer(self, tenant: str, req: CallRequest) -> SaveCheckpoint | None:
        """What takes the call's printed frames: a publish to the caller's subject, if any."""
        if not req.printed_to:
            return None  # nobody listens: the executor keeps the text on its own stderr
        subject = self.subjects.call_printed(tenant, req.printed_to)
        nc = self.runner.store.conn.nc

        async def forward(frame: bytes) -> None:
            stream = _STREAMS.get(frame[:1])
            if stream is None:
                raise ValueError("not a frame of printed text")
            text = frame[1:].decode("utf-8", "replace")
            with nats_errors():
                await nc.publish(subject, encode(CallOutput(stream=stream, text=text)))

        return forward

    async def _execute(
        self, spec: JobSpec, lease: Lease, req: CallRequest, printer: SaveCheckpoint | None
    ) -> bytes:
        runner = self.runner
        work = await runner.loader.work_of(spec)
        data = (
            await runner.store.call_input(spec.tenant, req.input_ref)
            if req.input_ref
            else req.input
        )
        frame = ipc.Run(input=data, attempt=1, job=lease.job, index=0)
        runner.ledger.occupy(lease.lease_id)
        try:
            output, _cost_s = await runner.pool.run(lease, work, frame, req.timeout_s, printer)
            return output
        finally:
            runner.ledger.vacate(lease.lease_id)

    def leases_changed(self) -> None:
        """Stop the calls whose lease is no longer live (released, expired, drained)."""
        now = time.monotonic()
        for lease_id, task in list(self._running.items()):
            if not self.runner.ledger.is_live(lease_id, now):
                log.info("call stopped: its lease ended lease=%s", lease_id)
                task.cancel()

    def _spec_of(self, tenant: str, lease: Lease, req: CallRequest) -> JobSpec:
        """The call as the job spec the code checks and the code loader read."""
        key = (tenant, lease.job, req.name, req.digest, req.python, req.timeout_s)
        spec = self._specs.get(key)
        if spec is None:
            if len(self._specs) >= _SPECS_KEPT:
                self._specs.clear()
            spec = self._specs[key] = JobSpec(
                tenant=tenant,
                kernel=req.name,
                kernel_digest=req.digest,
                n_chunks=1,
                kernel_kind="python",
                python=req.python,
                timeout_s=req.timeout_s,
                job_id=lease.job,
            )
        return spec
