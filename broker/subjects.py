"""Every subject, stream, bucket, consumer and header name of the protocol, and nothing else.

`Subjects(prefix)` builds them all from one prefix, so tests can share one server under unique
prefixes. Wildcards come only from methods named `*_filter`, which keeps them out of publishes.
docs/protocol/names.md mirrors this file and a test holds the two together.
"""

from __future__ import annotations

import base64
import re

import attrs

_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
# Chunks per packed message (ChunkPack, PackResult) at most: a pack's inputs and outputs fit
# the server's 1 MiB payload, and a pack is retried whole.
MAX_PACK_CHUNKS = 1000
# A chunk index as `result()` writes it: ASCII digits, no sign, no leading zero, and short
# enough to be an int64 (int() of a huge string raises, and `²` passes `str.isdigit`).
_INDEX = re.compile(r"0|[1-9][0-9]{0,17}")

HEADER_MSG_ID = "Nats-Msg-Id"

LEASE_OPS = ("acquire", "renew", "release", "held")

# Leases held for interactive calls (`fabric.gpu()`) carry a job name with this prefix: no
# job, consumer or spec exists for them, so nodes start no puller.
INTERACTIVE_JOB_PREFIX = "_gpu_"

# The JetStream API of a client's own account.
JS_API = "$JS.API"


def token(value: str, what: str = "token") -> str:
    """Return `value` if it is a safe subject token, else raise ValueError naming `what`."""
    # fullmatch: `$` would let a trailing newline through into a protocol line.
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} is not a subject token (letters, digits, '_' and '-' only)"
        )
    return value


def _prefix(value: str) -> None:
    # Stream names carry the prefix upper-cased: `vf` and `VF` must not share streams.
    if token(value, "prefix") != value.lower():
        raise ValueError(f"prefix {value!r} must be lower case")


@attrs.frozen
class Subjects:
    """The names of one fabric, all derived from `prefix` (default `vf`)."""

    prefix: str = attrs.field(default="vf", validator=lambda _i, _a, v: _prefix(v))

    # --- core subjects -------------------------------------------------------------------
    def node_advert(self, node: str) -> str:
        """Subject of a node's heartbeat advert."""
        return f"{self.prefix}.node.{token(node, 'node')}.advert"

    def advert_filter(self) -> str:
        """Wildcard over every node's advert."""
        return f"{self.prefix}.node.*.advert"

    def lease(self, tenant: str, node: str, op: str) -> str:
        """Request subject of a lease operation (acquire, renew, release, held) on one node."""
        if op not in LEASE_OPS:
            raise ValueError(f"unknown lease op {op!r}; expected one of {LEASE_OPS}")
        return f"{self.prefix}.lease.{token(tenant, 'tenant')}.{token(node, 'node')}.{op}"

    def lease_filter(self, node: str) -> str:
        """Wildcard over every tenant's lease requests to one node."""
        return f"{self.prefix}.lease.*.{token(node, 'node')}.*"

    def parse_lease(self, subject: str) -> tuple[str, str, str]:
        """Split a lease request subject into (tenant, node, op); ValueError if it is not one."""
        parts = subject.split(".")
        if len(parts) != 5 or parts[0] != self.prefix or parts[1] != "lease":
            raise ValueError(f"not a lease subject: {subject!r}")
        if parts[4] not in LEASE_OPS:
            raise ValueError(f"unknown lease op {parts[4]!r}")
        return parts[2], parts[3], parts[4]

    def call(self, tenant: str, node: str) -> str:
        """Request subject of an interactive call on one of the tenant's leases on one node."""
        return f"{self.prefix}.call.{token(tenant, 'tenant')}.{token(node, 'node')}"

    def call_filter(self, node: str) -> str:
        """Wildcard over every tenant's interactive calls to one node."""
        return f"{self.prefix}.call.*.{token(node, 'node')}"

    def tenant_calls_filter(self, tenant: str) -> str:
        """Wildcard over one tenant's interactive calls to any node (its account's import)."""
        return f"{self.prefix}.call.{token(tenant, 'tenant')}.>"

    def parse_call(self, subject: str) -> tuple[str, str]:
        """Split a call subject into (tenant, node); ValueError if it is not one."""
        parts = subject.split(".")
        if len(parts) != 4 or parts[0] != self.prefix or parts[1] != "call":
            raise ValueError(f"not a call subject: {subject!r}")
        return token(parts[2], "tenant"), token(parts[3], "node")

    def call_printed(self, tenant: str, call: str) -> str:
        """Where the node sends what one call of the tenant prints while it runs."""
        return f"{self.prefix}.printed.{token(tenant, 'tenant')}.{token(call, 'call')}"

    def call_printed_filter(self, tenant: str) -> str:
        """Wildcard over what every call of one tenant prints (its account's stream import)."""
        return f"{self.prefix}.printed.{token(tenant, 'tenant')}.>"

    @staticmethod
    def interactive_job(name: str) -> str:
        """The job name the leases of one `fabric.gpu()` block are labelled with."""
        return f"{INTERACTIVE_JOB_PREFIX}{token(name, 'name')}"

    @staticmethod
    def is_interactive(job: str) -> bool:
        """Whether leases of `job` serve interactive calls (no job behind them)."""
        return job.startswith(INTERACTIVE_JOB_PREFIX)

    def work(self, tenant: str, job: str) -> str:
        """Subject that carries a job's chunk submissions."""
        return f"{self.prefix}.work.{token(tenant, 'tenant')}.{token(job, 'job')}"

    def work_filter(self, tenant: str) -> str:
        """Wildcard over every job's chunks of one tenant."""
        return f"{self.prefix}.work.{token(tenant, 'tenant')}.>"

    def result(self, tenant: str, job: str, index: int, last: int | None = None) -> str:
        """Subject of one chunk's result, or of a pack's (chunks `index`..`last`).

        The results stream keeps one message per subject: the first result of a chunk, or
        of a pack, wins.
        """
        base = f"{self.prefix}.result.{token(tenant, 'tenant')}.{token(job, 'job')}.{int(index)}"
        return base if last is None else f"{base}.{int(last)}"

    def parse_result(self, subject: str) -> tuple[str, str, int, int] | None:
        """(tenant, job, first, last chunk) of a result subject; None if `subject` is not one.

        A chunk's result has first == last; a pack's names its first and last chunk.
        Anyone who may publish a result may publish on any subject below the job's, so
        callers drop what this rejects (a non-numeric, signed or oversized tail, a range
        that runs backwards) rather than fail on it.
        """
        parts = subject.split(".")
        if len(parts) not in (5, 6) or parts[0] != self.prefix or parts[1] != "result":
            return None
        tenant, job, *indices = parts[2:]
        if not (_TOKEN.fullmatch(tenant) and _TOKEN.fullmatch(job)):
            return None
        if not all(_INDEX.fullmatch(i) for i in indices):
            return None
        first, last = int(indices[0]), int(indices[-1])
        if last < first or (len(indices) == 2 and last == first):
            return None
        return tenant, job, first, last

    def job_of(self, subject: str) -> tuple[str, str] | None:
        """(tenant, job) of a work or result subject, or of any subject below one's job.

        Lenient past the job's token: a stray message on `<job>.x` still belongs to (and is
        removed with) that job.
        """
        parts = subject.split(".", 4)
        if len(parts) < 4 or parts[0] != self.prefix or parts[1] not in ("work", "result"):
            return None
        if not (_TOKEN.fullmatch(parts[2]) and _TOKEN.fullmatch(parts[3])):
            return None
        return parts[2], parts[3]

    def result_range(
        self, subject: str, tenant: str, job: str, n_chunks: int
    ) -> tuple[int, int] | None:
        """(first, last) chunk of a result subject of this job's `n_chunks`; None for any other."""
        parsed = self.parse_result(subject)
        if parsed is None or parsed[:2] != (tenant, job) or parsed[3] >= n_chunks:
            return None
        if parsed[3] - parsed[2] >= MAX_PACK_CHUNKS:
            return None  # no pack is that long
        return parsed[2], parsed[3]

    def result_filter(self, tenant: str, job: str | None = None) -> str:
        """Wildcard over one job's results, or all of a tenant's when `job` is None."""
        if job is None:
            return f"{self.prefix}.result.{token(tenant, 'tenant')}.>"
        return f"{self.prefix}.result.{token(tenant, 'tenant')}.{token(job, 'job')}.>"

    def chunk_results(self, tenant: str, job: str) -> str:
        """Wildcard over one job's results of single chunks (not of packs)."""
        return f"{self.prefix}.result.{token(tenant, 'tenant')}.{token(job, 'job')}.*"

    def pack_results(self, tenant: str, job: str) -> str:
        """Wildcard over one job's results of packs (`<first>.<last>`)."""
        return f"{self.prefix}.result.{token(tenant, 'tenant')}.{token(job, 'job')}.*.*"

    def event(self, kind: str) -> str:
        """Subject of lease and job events (`granted`, `released`, `expired`, ...)."""
        return f"{self.prefix}.events.{token(kind, 'event kind')}"

    # --- JetStream names -----------------------------------------------------------------
    def work_stream(self, tenant: str) -> str:
        """Work-queue stream of one tenant's chunks."""
        return f"{self.prefix.upper()}_WORK_{token(tenant, 'tenant')}"

    def results_stream(self, tenant: str) -> str:
        """First-result-wins stream of one tenant's chunk results."""
        return f"{self.prefix.upper()}_RESULTS_{token(tenant, 'tenant')}"

    def job_consumer(self, job: str) -> str:
        """Durable pull consumer shared by every lease of one job."""
        return f"{self.prefix}_job_{token(job, 'job')}"

    @staticmethod
    def direct_get(api: str, stream: str) -> str:
        """JetStream API subject of direct gets from a stream (`api`: an import's prefix)."""
        return f"{api}.DIRECT.GET.{token(stream, 'stream')}"

    @staticmethod
    def pull_next(stream: str, consumer: str, api: str = JS_API) -> str:
        """JetStream API subject for raw pull requests on a consumer (`api`: an import's prefix)."""
        return f"{api}.CONSUMER.MSG.NEXT.{token(stream, 'stream')}.{token(consumer, 'consumer')}"

    @staticmethod
    def stream_info_api(stream: str) -> str:
        """JetStream API subject for stream info (used with a subjects filter and paging)."""
        return f"$JS.API.STREAM.INFO.{token(stream, 'stream')}"

    def dead_stream(self, tenant: str) -> str:
        """Stream keeping the max-deliveries advisories of a tenant's job consumers."""
        return f"{self.prefix.upper()}_DEAD_{token(tenant, 'tenant')}"

    @staticmethod
    def max_deliveries(stream: str, consumer: str) -> str:
        """Advisory JetStream sends when a message of `consumer` runs out of deliveries."""
        return (
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."
            f"{token(stream, 'stream')}.{token(consumer, 'consumer')}"
        )

    def max_deliveries_filter(self, tenant: str) -> str:
        """Wildcard over the max-deliveries advisories of every consumer of a tenant's work."""
        return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.work_stream(tenant)}.*"

    def nodes_bucket(self) -> str:
        """KV bucket holding the latest advert of every live node."""
        return f"{self.prefix}_nodes"

    def jobs_bucket(self) -> str:
        """KV bucket holding job specs under `<tenant>.<job>`."""
        return f"{self.prefix}_jobs"

    def kernels_store(self, tenant: str) -> str:
        """Object store of one tenant's uploaded code (kernel blobs) by sha256."""
        return f"{self.prefix}_kernels_{token(tenant, 'tenant')}"

    def outputs_store(self, tenant: str) -> str:
        """Object store of one tenant's large chunk outputs (`<job>.<chunk>` objects)."""
        return f"{self.prefix}_out_{token(tenant, 'tenant')}"

    @staticmethod
    def output_object(job: str, index: int) -> str:
        """Name of one chunk's output in its tenant's outputs store."""
        return f"{token(job, 'job')}.{int(index)}"

    @staticmethod
    def parse_output_object(name: str) -> tuple[str, int] | None:
        """(job, chunk index) of an outputs store object name; None if `name` is not one."""
        job, _, index = name.rpartition(".")
        if not (_TOKEN.fullmatch(job) and _INDEX.fullmatch(index)):
            return None
        return job, int(index)

    def checkpoints_bucket(self) -> str:
        """KV bucket of long chunks' checkpoints under `<tenant>.<job>.<chunk>`."""
        return f"{self.prefix}_checkpoints"

    def quota_bucket(self) -> str:
        """KV bucket of each tenant's quota reservations per node, key `<tenant>`."""
        return f"{self.prefix}_quota"

    @staticmethod
    def checkpoint_key(tenant: str, job: str, index: int) -> str:
        """Key of one chunk's last checkpoint in the checkpoints bucket."""
        return f"{token(tenant, 'tenant')}.{token(job, 'job')}.{int(index)}"

    def job_spec(self, tenant: str, job: str) -> str:
        """Subject a coordinator publishes a job spec to: a KV put without any KV API call."""
        return f"{self.kv_subjects(self.jobs_bucket())[:-1]}{self.job_key(tenant, job)}"

    @staticmethod
    def kv_stream(bucket: str) -> str:
        """The stream under a KV bucket (nats-py's naming)."""
        return f"KV_{token(bucket, 'bucket')}"

    @staticmethod
    def kv_subjects(bucket: str) -> str:
        """Wildcard over the subjects of a KV bucket's keys."""
        return f"$KV.{token(bucket, 'bucket')}.>"

    @staticmethod
    def object_stream(bucket: str) -> str:
        """The stream under an object store (nats-py's naming)."""
        return f"OBJ_{token(bucket, 'bucket')}"

    @staticmethod
    def object_subjects(bucket: str) -> str:
        """Wildcard over the chunk and meta subjects of an object store."""
        return f"$O.{token(bucket, 'bucket')}.>"

    @staticmethod
    def object_meta(bucket: str, name: str) -> str:
        """The meta subject of one object (nats-py's naming: the name, urlsafe base64)."""
        encoded = base64.urlsafe_b64encode(name.encode()).decode()
        return f"$O.{token(bucket, 'bucket')}.M.{encoded}"

    @staticmethod
    def object_chunks(bucket: str, nuid: str) -> str:
        """The subject of one object's chunks (nats-py's naming: the object's nuid)."""
        return f"$O.{token(bucket, 'bucket')}.C.{token(nuid, 'nuid')}"

    @staticmethod
    def object_meta_subjects(bucket: str) -> str:
        """Wildcard over the meta subjects (one per object name) of an object store."""
        return f"$O.{token(bucket, 'bucket')}.M.>"

    # --- accounts (auth on): what one account reaches of another through imports ---------
    def fleet_api(self) -> str:
        """JetStream API prefix under which a tenant's account reaches the adverts bucket.

        The FABRIC account exports reads of the adverts bucket; each tenant's account imports
        them under this prefix (its own `$JS.API` is its own JetStream).
        """
        return f"$VF.{self.prefix}.fleet.API"

    def tenant_api(self, tenant: str) -> str:
        """JetStream API prefix under which the workers reach one tenant's account.

        The tenant's account exports the few calls workers make (pull, job spec, code and
        output reads and puts); the FABRIC account imports them under this prefix.
        """
        return f"$VF.{self.prefix}.{token(tenant, 'tenant')}.API"

    @staticmethod
    def is_inbox(reply: str) -> bool:
        """Whether a reply subject is an asker's inbox (its own, or `_R_.`: server-made).

        A request that crossed from another account arrives with a reply the server made,
        which leads back to the asker's account only.
        """
        return reply.startswith(("_INBOX.", "_INBOX_", "_R_."))

    @staticmethod
    def inbox_prefix(user: str) -> str:
        """The reply-inbox prefix of a user: its replies cannot be read by another user."""
        return f"_INBOX_{token(user, 'user')}"

    def job_key(self, tenant: str, job: str) -> str:
        """Key of a job spec in the jobs bucket."""
        return f"{token(tenant, 'tenant')}.{token(job, 'job')}"

    @staticmethod
    def job_state_key(tenant: str, job: str) -> str:
        """Key of a job's run record (JobRecord) in the jobs bucket, beside its spec."""
        return f"{token(tenant, 'tenant')}.{token(job, 'job')}.state"

    @staticmethod
    def job_alive_key(tenant: str, job: str) -> str:
        """Key of the heartbeat (JobDriver) of the process driving a job, with a per-key TTL."""
        return f"{token(tenant, 'tenant')}.{token(job, 'job')}.alive"

    @staticmethod
    def job_origin_key(tenant: str, job: str) -> str:
        """Key of how a job was started (JobOrigin): the job file another process resumes."""
        return f"{token(tenant, 'tenant')}.{token(job, 'job')}.origin"

    def job_record(self, tenant: str, job: str) -> str:
        """The stream subject of a job's run record: `cancel` publishes there, runs listen."""
        return self.kv_subject(self.jobs_bucket(), self.job_state_key(tenant, job))

    def job_records(self, tenant: str) -> str:
        """Wildcard over the stream subjects of every run record of one tenant (`jobs`)."""
        return self.kv_subject(self.jobs_bucket(), f"{token(tenant, 'tenant')}.*.state")

    @staticmethod
    def kv_job_filter(bucket: str, tenant: str, job: str) -> str:
        """Wildcard over a job's keys below `<tenant>.<job>.` in a KV bucket's stream."""
        return f"$KV.{token(bucket, 'bucket')}.{token(tenant, 'tenant')}.{token(job, 'job')}.>"

    @staticmethod
    def kv_subject(bucket: str, key: str) -> str:
        """The stream subject of one KV key (purging it removes the key outright)."""
        return f"$KV.{token(bucket, 'bucket')}.{key}"

    @staticmethod
    def chunk_msg_id(job: str, index: int, last: int | None = None) -> str:
        """Value of `Nats-Msg-Id` for one chunk (or a pack to `last`): its submission's key."""
        return f"{job}:{int(index)}" if last is None else f"{job}:{int(index)}-{int(last)}"

    @staticmethod
    def chunk_range_of(msg_id: str) -> tuple[int, int] | None:
        """(first, last) chunk of a work message's `Nats-Msg-Id`, if it parses.

        `<job>:<chunk>[:<run>]` names one chunk, `<job>:<first>-<last>[:<run>]` a pack.
        """
        parts = msg_id.split(":")
        if len(parts) not in (2, 3):
            return None
        first, dash, last = parts[1].partition("-")
        last = last if dash else first
        if not (first.isdigit() and last.isdigit()) or int(last) < int(first):
            return None
        return int(first), int(last)

    @staticmethod
    def delivery_of(reply: str) -> tuple[int, int] | None:
        """(times delivered, stream sequence) of a JetStream message, from its ack subject.

        What nats-py's `msg.metadata` gives, without building its dataclasses (a hot path):
        `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...` (9 tokens) or, with a domain and
        an account hash, `$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>...`
        (11 or 12). None if `reply` is neither.
        """
        parts: list[str] = reply.split(".") if reply else []
        if len(parts) < 9 or parts[0] != "$JS" or parts[1] != "ACK":
            return None
        at = 4 if len(parts) == 9 else 6
        if len(parts) not in (9, 11, 12) or not (parts[at].isdigit() and parts[at + 1].isdigit()):
            return None
        return int(parts[at]), int(parts[at + 1])

    @staticmethod
    def chunk_retry_msg_id(job: str, index: int, run: str, last: int | None = None) -> str:
        """`Nats-Msg-Id` of a chunk (or pack) submitted again by a `retry_failed` run.

        A fresh id, so the stream's dedup window does not swallow it.
        """
        return f"{Subjects.chunk_msg_id(job, index, last)}:{token(run, 'run')}"

    @staticmethod
    def result_msg_id(job: str, index: int, work_seq: int, last: int | None = None) -> str:
        """Value of `Nats-Msg-Id` for a chunk's (or pack's) result: a retried publish is idempotent.

        `work_seq` is the work message's stream sequence: a chunk submitted again (a
        `retry_failed` rerun) is a new message, and its result must not be taken for a
        duplicate of the first one's inside the dedup window.
        """
        return f"r:{Subjects.chunk_msg_id(job, index, last)}:{int(work_seq)}"
