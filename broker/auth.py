"""nats-server configuration from a tenants file: one NATS account per tenant, and FABRIC.

Permissions never cover the reply subject of a request, and whatever answers a request (the
JetStream API, a direct get, a node's lease service) publishes where the asker says, with
its own rights (NATS_GUIDE.md section 12). So within one account any user reaches every
subject of it. Each tenant therefore gets an account of its own: its streams, buckets,
stores, inboxes and JetStream API live there, and what crosses to the fabric's account
(workers, operator, adverts, lease services) is only what the narrow imports and exports
below name. Inside its account a tenant's user is still held to its own subjects and
streams (it may not create or delete streams: the operator provisions them). Permission
patterns are built here, from the names in subjects.py; they are config, not subjects
anyone publishes to.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable
from pathlib import Path

import attrs

from . import topology
from .connection import connect
from .settings import BrokerSettings
from .subjects import Subjects
from .tenants import OPERATOR_USER, WORKERS_USER, Credential, Tenant, TenantsFile
from .tls import ServerTls

_API = "$JS.API"
# nats-server's own default JetStream memory total: this share of the host's memory.
_HOST_SHARE = 0.75
# Memory beyond the tenants' limits in an overcommitted total: the fabric's own account.
_FABRIC_ROOM_BYTES = 2**30


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
    carries any name in its payload: a user could create a named one (docs/operations.md).
    """
    return [
        f"{_API}.STREAM.INFO.{stream}",
        f"{_API}.STREAM.MSG.GET.{stream}",
        f"{_API}.DIRECT.GET.{stream}",
        f"{_API}.DIRECT.GET.{stream}.>",
        f"{_API}.CONSUMER.CREATE.{stream}",
        f"{_API}.CONSUMER.INFO.{stream}.*",
    ]


FABRIC_ACCOUNT = "FABRIC"


def tenant_account(tenant: str) -> str:
    """The NATS account of one tenant (its streams, buckets, stores, inboxes, JetStream API)."""
    return f"TENANT_{tenant}"


def operator_user(tenant: str) -> str:
    """The operator's user inside one tenant's account: it provisions that account's streams."""
    return f"{OPERATOR_USER}_{tenant}"


def _fleet_reads(s: Subjects, api: str = _API) -> list[str]:
    """Reading the adverts bucket: its info and its messages, nothing that writes."""
    stream = s.kv_stream(s.nodes_bucket())
    return [
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
    ]


def _worker_paths(s: Subjects, tenant: str, api: str = _API) -> list[tuple[str, bool]]:
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
        # an output's meta (worker/store.py). No purge: a purge takes a filter of the
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
        # deletes it (coordinator/exhausted.py).
        f"{_API}.STREAM.MSG.DELETE.{s.work_stream(tenant)}",
        *_fleet_reads(s, s.fleet_api()),  # imported from the fabric's account
        # nats-py's object-store get looks its stream up by subject.
        f"{_API}.STREAM.NAMES",
    ]
    # A running job hears a `cancel` on its record's own subject (coordinator/record.py).
    subscribe = [f"{s.inbox_prefix(tenant)}.>", s.advert_filter(), s.job_records(tenant)]
    subscribe.append(s.call_printed_filter(tenant))  # imported: what its calls print
    return {"publish": {"allow": publish}, "subscribe": {"allow": subscribe}}


def worker_permissions(s: Subjects, tenants: Iterable[str]) -> dict[str, object]:
    """The node agents' user in the fabric's account: serve leases, advertise, run work.

    It reaches a tenant's account only through what that account exports (`_worker_paths`):
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
        publish += [subject for subject, _ in _worker_paths(s, tenant, s.tenant_api(tenant))]
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


def _user(name: str, cred: Credential, permissions: dict[str, object] | None) -> dict[str, object]:
    user: dict[str, object] = (
        {"nkey": cred.nkey} if cred.nkey else {"user": name, "password": cred.password}
    )
    if permissions is not None:
        user["permissions"] = permissions
    return user


def server_config(
    tenants: TenantsFile,
    subjects: Subjects,
    *,
    host: str = "127.0.0.1",
    port: int = 4222,
    tls: ServerTls | None = None,
) -> str:
    """The nats-server config text: JetStream on, one account per tenant and the fabric's.

    The operator has no permission limits. The config is JSON, which nats-server's
    config parser reads as it is (no escaping rules of our own to get wrong).
    """
    config = {
        "listen": f"{host}:{port}",
        "jetstream": _jetstream(tenants),
        "accounts": accounts(tenants, subjects),
    }
    if tls is not None:  # clients must use TLS: their passwords never cross in clear
        config["tls"] = tls.client_block()
    return json.dumps(config, indent=2)


def _jetstream(tenants: TenantsFile) -> dict[str, object]:
    """The server's `jetstream` block: totals with room for every tenant account's limits.

    nats-server reserves each account's `max_mem` out of its own total (by default 75% of
    the host's memory) and will not start where they do not fit: 500 tenants at the default
    256 MiB are 125 GiB. Where they would not fit, the total is set to their sum plus the
    fabric's room: each tenant stays bound by its limit, but together they are promised
    more memory than the host holds (docs/operations.md, Account limits).
    """
    reserved = sum(max(t.limits.memory_storage_bytes, 0) for t in tenants.tenants)
    host_bytes = int(_HOST_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    if reserved + _FABRIC_ROOM_BYTES <= host_bytes:
        return {}
    return {"max_memory_store": reserved + _FABRIC_ROOM_BYTES}


def _export(
    kind: str, subject: str, accounts: list[str], *, streams: bool = False
) -> dict[str, object]:
    """An export of a `kind` ("service" or "stream") to `accounts` only.

    A service whose requests are answered by several messages (pulls of work) says so, or
    the server forgets the way back after the first one.
    """
    entry: dict[str, object] = {kind: subject, "accounts": accounts}
    if streams:
        entry["response_type"] = "stream"
    return entry


def _service(subject: str, account: str, to: str | None = None) -> dict[str, object]:
    """A service import of `subject` from `account`, under `to` here when given."""
    entry: dict[str, object] = {"service": {"account": account, "subject": subject}}
    if to is not None and to != subject:
        entry["to"] = to
    return entry


def accounts(tenants: TenantsFile, subjects: Subjects) -> dict[str, object]:
    """The `accounts` block: the fabric's account and one per tenant, joined by narrow imports.

    FABRIC holds the operator and the workers, the adverts, the lease services and the
    checkpoints. A tenant's account holds its user, its streams, buckets and stores, and
    the operator's user for it. What crosses (docs/operations.md has the picture): lease
    requests of that tenant to the nodes, adverts and reads of the adverts bucket (fabric
    to tenant); interactive calls of that tenant to the nodes, and what they print (fabric
    to tenant); the work,
    result, code and output paths the workers need (tenant to fabric).
    A request that crosses is answered on a reply subject the server makes, which leads back
    to the asker's account and nowhere else.
    """
    if tenants.operator.password is None:
        raise ValueError(
            "the operator needs a password (it provisions each tenant's account as "
            f"{operator_user('<tenant>')} with it)"
        )
    s = subjects
    names = [t.name for t in tenants.tenants]
    fleet = _fleet_reads(s)
    every = [tenant_account(n) for n in names]
    fabric_exports = [
        _export("stream", s.advert_filter(), every),
        *(_export("service", sub, every) for sub in fleet),
        *(_export("service", f"{s.prefix}.lease.{n}.>", [tenant_account(n)]) for n in names),
        *(_export("service", s.tenant_calls_filter(n), [tenant_account(n)]) for n in names),
        *(_export("stream", s.call_printed_filter(n), [tenant_account(n)]) for n in names),
    ]
    fabric_imports: list[dict[str, object]] = []
    out: dict[str, object] = {}
    for tenant in tenants.tenants:
        n, account = tenant.name, tenant_account(tenant.name)
        exported = _worker_paths(s, n)
        imported = _worker_paths(s, n, s.tenant_api(n))
        fabric_imports += [
            _service(src, account, to) for (src, _), (to, _) in zip(exported, imported, strict=True)
        ]
        out[account] = {
            # The tenant's own streams count against these too (broker/limits.py); FABRIC
            # (workers, operator, adverts, quota, checkpoints) stays unlimited.
            "jetstream": tenant.limits.jetstream(),
            "limits": tenant.limits.limits(),
            "users": [
                _tenant_user(s, tenant),
                _user(operator_user(n), tenants.operator, None),
            ],
            "exports": [
                _export("service", sub, [FABRIC_ACCOUNT], streams=streams)
                for sub, streams in exported
            ],
            "imports": [
                _service(f"{s.prefix}.lease.{n}.>", FABRIC_ACCOUNT),
                _service(s.tenant_calls_filter(n), FABRIC_ACCOUNT),
                {"stream": {"account": FABRIC_ACCOUNT, "subject": s.advert_filter()}},
                {"stream": {"account": FABRIC_ACCOUNT, "subject": s.call_printed_filter(n)}},
                *(
                    _service(src, FABRIC_ACCOUNT, to)
                    for src, to in zip(fleet, _fleet_reads(s, s.fleet_api()), strict=True)
                ),
            ],
        }
    users = [
        _user(OPERATOR_USER, tenants.operator, None),
        _user(WORKERS_USER, tenants.workers, worker_permissions(s, names)),
    ]
    fabric = {"jetstream": "enabled", "users": users, "exports": fabric_exports}
    fabric["imports"] = fabric_imports
    return {FABRIC_ACCOUNT: fabric, **out}


def _tenant_user(subjects: Subjects, tenant: Tenant) -> dict[str, object]:
    return _user(tenant.name, tenant.credential, tenant_permissions(subjects, tenant.name))


def write_config(
    tenants: TenantsFile, subjects: Subjects, path: str | Path, *, port: int = 4222
) -> Path:
    """Write the server config where only its owner can read it (it may hold passwords)."""
    return write_private(path, server_config(tenants, subjects, port=port))


def write_private(path: str | Path, text: str) -> Path:
    """Write `text` to a file only its owner can read, even if it existed with a wider mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(fd, 0o600)  # O_CREAT's mode applies to a new file only
        out.write(text)
    return Path(path)


def settings_for(base: BrokerSettings, user: str, password: str | None) -> BrokerSettings:
    """`base` connecting as `user` (tests and the local fabric; a deployment uses the env)."""
    return attrs.evolve(base, user=user, password=password, creds_file=None, nkey_seed_file=None)


async def provision_tenants(
    operator: BrokerSettings, tenants: TenantsFile, only: Collection[str] | None = None
) -> None:
    """As the operator, create the fabric's buckets, then each tenant's streams and stores.

    Each tenant's are made in its own account, logged in as the operator's user there;
    `only` names the tenants to provision (None: all), such as those just added.
    """
    conn = await connect(operator, name="provision")
    try:
        await topology.provision_fabric(conn.js, operator)
    finally:
        await conn.close()
    for tenant in tenants.tenants:
        if only is not None and tenant.name not in only:
            continue
        inside = settings_for(operator, operator_user(tenant.name), operator.password)
        conn = await connect(inside, name="provision")
        try:
            await topology.provision_tenant(conn.js, inside, tenant.name)
        finally:
            await conn.close()
