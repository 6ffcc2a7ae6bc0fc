"""JetStream names: streams, consumers, KV buckets and keys, object stores, API subjects."""

from __future__ import annotations

import base64

from .tokens import INDEX, JS_API, TOKEN, token


class JetStreamNames:
    """The streams, consumers, buckets and stores of one fabric's `prefix`, and their subjects."""

    __slots__ = ()
    prefix: str

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
    def call_input_object(call: str) -> str:
        """Name of one call's input in its tenant's kernels store (`call`: a fresh token)."""
        return f"call-input-{token(call, 'call')}"

    @staticmethod
    def output_object(job: str, index: int) -> str:
        """Name of one chunk's output in its tenant's outputs store."""
        return f"{token(job, 'job')}.{int(index)}"

    @staticmethod
    def parse_output_object(name: str) -> tuple[str, int] | None:
        """(job, chunk index) of an outputs store object name; None if `name` is not one."""
        job, _, index = name.rpartition(".")
        if not (TOKEN.fullmatch(job) and INDEX.fullmatch(index)):
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
