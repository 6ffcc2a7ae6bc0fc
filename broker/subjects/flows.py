"""The core subjects of the protocol's flows: adverts, leases, calls, work, results, events."""

from __future__ import annotations

from .tokens import INDEX, INTERACTIVE_JOB_PREFIX, LEASE_OPS, MAX_PACK_CHUNKS, TOKEN, token


class FlowSubjects:
    """The subjects messages of each flow travel on, under one fabric's `prefix`."""

    __slots__ = ()
    prefix: str

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
        if not (TOKEN.fullmatch(tenant) and TOKEN.fullmatch(job)):
            return None
        if not all(INDEX.fullmatch(i) for i in indices):
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
        if not (TOKEN.fullmatch(parts[2]) and TOKEN.fullmatch(parts[3])):
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
