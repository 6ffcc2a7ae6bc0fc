"""Wire types of interactive calls: one function call on one lease, by request-reply.

A `with fabric.gpu()` block holds a lease and sends each `gpu.run` straight to the node that
holds it, on `Subjects.call(tenant, node)`. The node runs the call in the lease's executor
slot like a chunk and answers with a CallReply; nothing is stored on the way (no job record,
consumer or spec). The work is uploaded code named by digest, as a batch job's is. What the
call prints comes back while it runs, as CallOutput messages on a subject the caller names
(before the CallReply); an outcome too large for a message goes through the tenant's outputs
object store and the CallReply names it, and an input too large for one goes through the
tenant's kernels store (where its code is) and the CallRequest names it.
"""

from __future__ import annotations

import attrs

from .errors import ErrorKind
from .messages import PROTOCOL_VERSION
from .subjects import token

# What a call's input and reply may carry: the server's default max_payload less room for
# the envelope. A larger input or outcome travels through an object store (named in the
# message), up to MAX_CALL_INPUT_BYTES or the work's max output.
MAX_CALL_BYTES = 1024 * 1024 - 16 * 1024
# A call's input at most, through the store: a job's largest output (kernels/code.py's
# DEFAULT_MAX_OUTPUT_BYTES), so that what a `%%gpu` cell sends may be as large as what it
# brings back; well within an executor frame (worker/executor/ipc.py, 256 MiB).
MAX_CALL_INPUT_BYTES = 64 * 2**20


def _is_token(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    token(value, attr.name)


def _is_empty_or_token(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if value:
        token(value, attr.name)


@attrs.frozen
class CallRequest:
    """Run the uploaded work `digest` (a pickled callable) on `input` in lease `lease_id`'s slot.

    The tenant is not a field: it is read from the subject (the server's permissions guard
    it), and the node serves only a lease of that tenant.
    """

    lease_id: str = attrs.field(validator=_is_token)
    name: str
    digest: str = attrs.field(validator=_is_token)
    python: str
    input: bytes
    timeout_s: float = attrs.field(validator=[attrs.validators.gt(0), attrs.validators.le(86_400)])
    # A fresh token of the caller's: what the call prints goes to `Subjects.call_printed(tenant,
    # printed_to)` while it runs. Empty: nothing is sent while it runs.
    printed_to: str = attrs.field(default="", validator=_is_empty_or_token)
    # An input over MAX_CALL_BYTES: its object in the tenant's kernels store (`input` is
    # then empty), read by the node and deleted by the caller after the reply.
    input_ref: str = attrs.field(default="", validator=_is_empty_or_token)
    v: int = PROTOCOL_VERSION

    def __attrs_post_init__(self) -> None:
        """An input is carried or named, not both."""
        if self.input_ref and self.input:
            raise ValueError("a call names its input's object or carries it, not both")


@attrs.frozen
class CallOutput:
    """Text the call printed, sent on `Subjects.call_printed` while the call runs."""

    stream: str = attrs.field(validator=attrs.validators.in_(("stdout", "stderr")))
    text: str
    v: int = PROTOCOL_VERSION


@attrs.frozen
class CallReply:
    """The outcome of one call: the pickled output (or the object holding it), or the error."""

    ok: bool
    output: bytes | None = None
    # An outcome over MAX_CALL_BYTES: its object in the tenant's outputs store, read (and
    # deleted) by the caller.
    output_ref: str | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
    node: str = ""
    elapsed_s: float = 0.0
    # False: refused before anything of the call ran (sending it again cannot run it twice).
    started: bool = True
    v: int = PROTOCOL_VERSION
