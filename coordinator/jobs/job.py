"""Job: what a user runs, and its spec (the id a hash of the spec unless given).

The same job run twice has the same id, so the second run resumes the first: it reads which
chunks already have results and submits only the others (publish.py, run/). A Span names a
run of chunks that travel as one message.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any

import attrs

from vramfabric.broker.messages import JobSpec
from vramfabric.broker.retry import RetryPolicy
from vramfabric.broker.subjects import MAX_PACK_CHUNKS
from vramfabric.kernels.code import DEFAULT_MAX_OUTPUT_BYTES

from ..settings import CoordinatorSettings
from .work import JobWork, Work, job_work

log = logging.getLogger(__name__)

# A streamed job's chunk count until its inputs run out: the protocol's maximum.
UNKNOWN_CHUNKS = 10_000_000


@attrs.frozen
class Job:
    """What a user runs: a kernel, a CUDA kernel or a Python function over chunk inputs.

    A registered `Kernel` or a `CudaKernel` takes bytes; a function takes any picklable
    objects (and returns any). `inputs` may be a list (any sized collection) or a one-shot
    iterable such as a generator, read lazily while the job runs. Leave `job_id` empty to
    derive it from the work, args and inputs: the same job run twice is then a resume, not a
    duplicate. A generator can be read only once, so a job over one gets a fresh random id
    unless given a `job_id` (give one to make it resumable). `timeout_s` is each chunk's
    deadline (default: the worker's). `chunks_per_message` overrides the fabric's setting
    for this job (0 auto, 1 one chunk per message, N up to N: coordinator/run/packing.py); it
    is not part of the job id.
    """

    kernel: Work
    inputs: Iterable[Any]
    args: Mapping[str, Any] = attrs.field(factory=dict)
    job_id: str = ""
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    timeout_s: float | None = None
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    chunks_per_message: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(
            [attrs.validators.ge(0), attrs.validators.le(MAX_PACK_CHUNKS)]
        ),
    )
    work: JobWork = attrs.field(init=False)
    # The inputs digest of a sized job by input limit, computed once (a pass over the inputs).
    _digests: dict[int, str] = attrs.field(factory=dict, init=False, repr=False, eq=False)
    # That pass's encoded inputs by input limit, while small (`KEEP_ENCODED_BYTES`), for the
    # run that follows (`take_encoded`): encoding them again was a tenth of its CPU.
    _kept: dict[int, list[list[bytes]]] = attrs.field(
        factory=dict, init=False, repr=False, eq=False
    )
    _random_id: str = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        """Describe the work (TypeError if it cannot be shipped)."""
        object.__setattr__(self, "work", job_work(self.kernel, self.max_output_bytes))
        object.__setattr__(self, "_random_id", uuid.uuid4().hex[:16])

    @property
    def output_dtype(self) -> str:
        """How outputs decode: a numpy dtype name, or `pickle` for a function's results."""
        return self.work.output_dtype

    @property
    def streamed(self) -> bool:
        """Whether the inputs can be read only once (an iterator or generator, not a list)."""
        return isinstance(self.inputs, Iterator) or not isinstance(self.inputs, Sized)

    @property
    def size(self) -> int | None:
        """How many chunks the job has; None for a streamed job (known only once it ran)."""
        return None if self.streamed else len(self.inputs)  # type: ignore[arg-type]

    @property
    def encoded(self) -> list[bytes]:
        """Every input encoded, all in memory at once (for small jobs and tests)."""
        if self.streamed:
            raise TypeError("a job over a one-shot iterable cannot be encoded twice")
        return [
            d
            for first, values in blocks(self.inputs)
            for d in self.work.encode_inputs(first, values)
        ]

    def encode(self, index: int, value: Any, limit: int) -> bytes:
        """One input as chunk bytes (see `encode_many`)."""
        return self.encode_many(index, (value,), limit)[0]

    def encode_many(self, first: int, values: Sequence[Any], limit: int) -> list[bytes]:
        """Inputs `first`, `first + 1`, ... as chunk bytes, at once (cheaper per input).

        Raises:
            TypeError: an input cannot be encoded for this work.
            ValueError: one is over `limit` bytes.
        """
        return self._encode_sized(first, values, limit)[0]

    def _encode_sized(
        self, first: int, values: Sequence[Any], limit: int
    ) -> tuple[list[bytes], list[int]]:
        """`encode_many`'s bytes and their sizes (the digest and the spec's count reuse them)."""
        data = self.work.encode_inputs(first, values)
        sizes = list(map(len, data))
        if sizes and max(sizes) > limit:
            index = next(i for i, n in enumerate(sizes) if n > limit)
            raise ValueError(
                f"chunk {first + index} is {sizes[index]} bytes; the limit is {limit} (an input "
                "travels in a message: pass a smaller piece, or a path the function reads)"
            )
        return data, sizes

    def input_limit(self, settings: CoordinatorSettings) -> int:
        """The largest chunk input in bytes: the work's limit or the settings', the smaller."""
        return min(self.work.max_input_bytes, settings.max_chunk_bytes)

    def spec(self, settings: CoordinatorSettings) -> JobSpec:
        """The JobSpec stored in KV and read by workers.

        For a sized job this reads (and encodes) every input once, for the inputs digest
        and the default id. A streamed job's count is not known until its inputs run out:
        its spec says `UNKNOWN_CHUNKS` chunks and no digest until `Fabric.run` stores the
        real ones (see `final_spec`).

        Raises:
            ValueError: no inputs, a bad arg, or a chunk over the kernel's or the wire's
                size limit.
            TypeError: an input that cannot be encoded for this work.
        """
        check_args(self.args)
        if self.streamed:
            return self._spec(settings, UNKNOWN_CHUNKS, "", self.job_id or self._random_id)
        n = self.size
        if not n:
            raise ValueError("a job needs at least one chunk input")
        limit = self.input_limit(settings)
        if limit not in self._digests:
            digest = InputsDigest()
            kept: list[list[bytes]] | None = []
            kept_bytes = 0
            for first, values in blocks(self.inputs):
                data, sizes = self._encode_sized(first, values, limit)
                digest.add_many(data, sizes)
                if kept is not None:
                    kept_bytes += sum(sizes) + _ITEM_BYTES * len(data)
                    if kept_bytes > KEEP_ENCODED_BYTES:
                        kept = None
                    else:
                        kept.append(data)
            self._digests[limit] = digest.hexdigest()
            if kept is not None:
                self._kept[limit] = kept
        return self._spec(settings, n, self._digests[limit], self.job_id)

    def take_encoded(self, limit: int) -> list[list[bytes]] | None:
        """The inputs `spec` encoded under `limit`, in blocks of `BLOCK_CHUNKS` (once).

        None where `spec` kept none (a streamed job, or inputs past `KEEP_ENCODED_BYTES`).
        Taken once: a Job the user keeps does not hold its encoded inputs after its run.
        """
        return self._kept.pop(limit, None)

    def _spec(self, settings: CoordinatorSettings, n: int, digest: str, job_id: str) -> JobSpec:
        return JobSpec(
            tenant=settings.tenant,
            kernel=self.work.name,
            kernel_digest=self.work.digest,
            n_chunks=n,
            args=dict(self.args),
            inputs_digest=digest,
            retry=self.retry,
            ack_wait_s=settings.ack_wait_s,
            kernel_kind=self.work.kind,
            python=self.work.python,
            timeout_s=self.timeout_s,
            job_id=job_id,
        )


@attrs.define
class InputsDigest:
    """The sha256 of a job's encoded inputs: each as its 8-byte little-endian length, then it."""

    _sha: Any = attrs.field(factory=hashlib.sha256, init=False)

    def add(self, data: bytes) -> None:
        """Hash one chunk's input, in chunk order."""
        self._sha.update(len(data).to_bytes(8, "little"))
        self._sha.update(data)

    def add_many(self, inputs: Sequence[bytes], sizes: list[int] | None = None) -> None:
        """Hash chunks' inputs, in chunk order (as `add` each, in one update when small).

        `sizes`: their lengths, where the caller has them.
        """
        sizes = list(map(len, inputs)) if sizes is None else sizes
        if not sizes or sum(sizes) > _JOIN_BYTES or max(sizes) >= len(_LENGTHS):
            for data in inputs:
                self.add(data)
            return
        # Lengths and inputs interleaved by slice assignment: half the cost of chaining pairs.
        parts: list[bytes] = [b""] * (2 * len(sizes))
        parts[::2] = map(_LENGTHS.__getitem__, sizes)
        parts[1::2] = inputs
        self._sha.update(b"".join(parts))

    def hexdigest(self) -> str:
        """The digest of the inputs added so far."""
        return str(self._sha.hexdigest())


def check_args(args: Mapping[str, Any]) -> None:
    """Raise ValueError unless every job arg is a str key with a scalar value the wire carries."""
    for key, value in args.items():
        if not isinstance(key, str) or not isinstance(value, int | float | str | bytes | bool):
            raise ValueError(
                f"job arg {key!r} must be a str key with an int, float, str, "
                f"bytes or bool value, got {type(value).__name__}"
            )


# A run of chunks published as one message: (first, last); first == last is one chunk.
Span = tuple[int, int]

# Inputs of a sized job are read, encoded and submitted this many at a time: per input, the
# calls around one pickle cost more than the pickle.
BLOCK_CHUNKS = 256
# Encoded inputs a sized job keeps from its digest pass for its run, at most (counting each
# input's bytes object and list slot, `_ITEM_BYTES`, beside its bytes).
KEEP_ENCODED_BYTES = 64 * 2**20
_ITEM_BYTES = 41
# Inputs hashed in one update at most this large together (a join copies them), each
# shorter than _LENGTHS (their length prefixes, made once).
_JOIN_BYTES = 2**20
_LENGTHS = [n.to_bytes(8, "little") for n in range(4096)]


def blocks(inputs: Iterable[Any], size: int = BLOCK_CHUNKS) -> Iterator[tuple[int, list[Any]]]:
    """(index of the first, the inputs) of consecutive runs of `size` inputs."""
    it = iter(inputs)
    first = 0
    while block := list(itertools.islice(it, size)):
        yield first, block
        first += len(block)
