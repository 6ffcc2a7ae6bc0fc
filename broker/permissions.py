"""What each user may publish and subscribe to, inside its account and across to another.

Permission patterns are built here from the names in broker/subjects/: they are config,
not subjects anyone publishes to. Why each account's users are held to these lists, and
what crosses between accounts, is said in broker/auth.py.
"""

from __future__ import annotations

from collections.abc import Iterable

from .subjects import JS_API as _API
from .subjects import Subjects
from .tenants import WORKERS_USER


def _stream_reads(stream: str) -> list[str]:
    """Everything a stream's owner may do on it short of creating, changing or deleting it."""
    return [
        f"{_API}.STREAM.INFO.{stream}",
        f"{_API}.STREAM.MSG.GET.{stream}",
        f"{_API}.STREAM.PURGE.{stream}",
        f"{_API}.DIRECT.GET.{stream}",
        f"{_API}.DIRECT.GET.{stream}.>",
        f"{_API}.CONSUMER.CREATE.{stream}",
        f"{_API}.CONSUMER.CREATE.{stream}.>",
        f"{_API}.CONSUMER.DURABLE.CREATE.{stream}.*",
        f"{_API}.CONSUMER.INFO.{stream}.*",
        f"{_API}.CONSUMER.DELETE.{stream}.*",
        f"{_API}.CONSUMER.MSG.NEXT.{stream}.*",
        f"{_API}.CONSUMER.NAMES.{stream}",
        f"{_API}.CONSUMER.LIST.{stream}",
        f"$JS.ACK.{stream}.>",
        # Flow control of its push consumers (ordered consumers: results followed, objects
        # read): a consumer whose requests go unanswered is paused by the server (NATS_GUIDE.md
        # section 13).
        f"$JS.FC.{stream}.>",
    ]


def _shared_kv_read(stream: str) -> list[str]:
    """Reading a shared KV bucket: gets, and consumers through the old-style create subject.

    Our clients make server-named ephemeral consumers there, but the old-style subject
    carries any name in its payload: a user could create a named one (docs/operations/tenants.md).
    """
    return [
        f"{_API}.STREAM.INFO.{stream}",
        f"{_API}.STREAM.MSG.GET.{stream}",
        f"{_API}.DIRECT.GET.{stream}",
        f"{_API}.DIRECT.GET.{stream}.>",
        f"{_API}.CONSUMER.CREATE.{stream}",
        f"{_API}.CONSUMER.INFO.{stream}.*",
    ]


def fleet_reads(s: Subjects, api: str = _API) -> list[str]:
    """Reading the adverts bucket: its info and its messages, nothing that writes."""
    stream = s.kv_stream(s.nodes_bucket())
    return [
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
    ]


def worker_paths(s: Subjects, tenant: str, api: str = _API) -> list[tuple[str, bool]]:
    """What a tenant's account exports to the workers: (subject, streams replies).

    The JetStream calls are named with `api` (`$JS.API` where the tenant's account exports
    them, `Subjects.tenant_api` where the workers' account imports them). Pulls of work
    answer with many messages; everything else answers once. No call here reads results,
    outputs or job records, and none creates, changes or deletes anything but outputs.
    """
    work = s.work_stream(tenant)
    jobs = s.kv_stream(s.jobs_bucket())
    kernels = s.object_stream(s.kernels_store(tenant))
    outputs_bucket = s.outputs_store(tenant)
    outputs = s.object_stream(outputs_bucket)
    return [
        (f"{api}.CONSUMER.MSG.NEXT.{work}.*", True),
        (f"$JS.ACK.{work}.>", False),
        (s.result_filter(tenant), False),
        # Job specs only: `<tenant>.<job>` keys, not run records (`<tenant>.<job>.state`).
        (f"{api}.DIRECT.GET.{jobs}.{s.kv_subject(s.jobs_bucket(), tenant)}.*", False),
        # Code is read in batches of chunks: many answers to one request (broker/objects.py).
        (f"{api}.DIRECT.GET.{kernels}", True),
        (f"{api}.DIRECT.GET.{kernels}.>", False),
        # Large outputs: the chunks and meta an object put publishes, and the direct get of
        # an output's meta (worker/chunks/store.py). No purge: a purge takes a filter of the
        # caller's choosing, so it could empty the tenant's whole store; the chunks of an
        # output a worker replaces stay behind, unreadable as it (broker/objects.py).
        (s.object_subjects(outputs_bucket), False),
        (f"{api}.DIRECT.GET.{outputs}.{s.object_meta_subjects(outputs_bucket)}", False),
    ]


def tenant_permissions(s: Subjects, tenant: str) -> dict[str, object]:
    """The publish and subscribe allow-lists of one tenant's user, inside its own account."""
    kernels, outputs = s.kernels_store(tenant), s.outputs_store(tenant)
    own_streams = (
        s.work_stream(tenant),
        s.results_stream(tenant),
        s.dead_stream(tenant),
        s.object_stream(kernels),
        s.object_stream(outputs),
    )
    publish = [
        f"{s.prefix}.lease.{tenant}.>",  # imported: the nodes' lease service
        s.tenant_calls_filter(tenant),  # imported: interactive calls on its leases
        s.work_filter(tenant),
        s.result_filter(tenant),  # the coordinator records chunks that ran out of deliveries
        s.kv_subjects(s.jobs_bucket())[:-1] + f"{tenant}.>",  # its own job specs and records
        s.object_subjects(kernels),
        *(p for stream in own_streams for p in _stream_reads(stream)),
        # The jobs bucket in the tenant's account holds this tenant's keys alone: reading it
        # whole (pages of run records for `jobs`) or purging a removed job's keys reaches
        # nothing of anyone else's.
        *_stream_reads(s.kv_stream(s.jobs_bucket())),
        # A chunk that ran out of deliveries stays in the work queue until its coordinator
        # deletes it (coordinator/run/exhausted.py).
        f"{_API}.STREAM.MSG.DELETE.{s.work_stream(tenant)}",
        *fleet_reads(s, s.fleet_api()),  # imported from the fabric's account
        # nats-py's object-store get looks its stream up by subject.
        f"{_API}.STREAM.NAMES",
    ]
    # A running job hears a `cancel` on its record's own subject (coordinator/jobs/record.py).
    subscribe = [f"{s.inbox_prefix(tenant)}.>", s.advert_filter(), s.job_records(tenant)]
    subscribe.append(s.call_printed_filter(tenant))  # imported: what its calls print
    return {"publish": {"allow": publish}, "subscribe": {"allow": subscribe}}


def worker_permissions(s: Subjects, tenants: Iterable[str]) -> dict[str, object]:
    """The node agents' user in the fabric's account: serve leases, advertise, run work.

    It reaches a tenant's account only through what that account exports (`worker_paths`):
    pull and ack its work, read job specs and code, publish results and store outputs.
    Replies go only to the requester's inbox (`allow_responses`).
    """
    fabric_buckets = (s.nodes_bucket(), s.checkpoints_bucket(), s.quota_bucket())
    publish = [
        s.advert_filter(),
        f"{s.prefix}.events.>",
        *(s.kv_subjects(bucket) for bucket in fabric_buckets),
        *(p for bucket in fabric_buckets for p in _shared_kv_read(s.kv_stream(bucket))),
        f"{_API}.STREAM.NAMES",
    ]
    for tenant in tenants:
        publish += [subject for subject, _ in worker_paths(s, tenant, s.tenant_api(tenant))]
        publish.append(s.call_printed_filter(tenant))  # what its calls print, exported to it
    subscribe = [
        f"{s.inbox_prefix(WORKERS_USER)}.>",
        s.advert_filter(),
        f"{s.prefix}.lease.>",
        f"{s.prefix}.call.>",
    ]
    return {
        "publish": {"allow": publish},
        "subscribe": {"allow": subscribe},
        "allow_responses": True,
    }
