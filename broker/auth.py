"""nats-server configuration from a tenants file: one user per tenant, workers, operator.

A tenant's user may publish and read only its own subjects, and call the JetStream API only
on its own streams, each named exactly: a wildcard spanning tenants in a consumer-create
grant would let one tenant take over another's consumer (NATS_GUIDE.md section 8). It may
not create, update or delete streams (the operator provisions them): a stream a tenant could
create may capture another tenant's subjects. Permission patterns are built here, from the
names in subjects.py; they are config, not subjects anyone publishes to.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import attrs

from . import topology
from .connection import connect
from .settings import BrokerSettings
from .subjects import Subjects
from .tenants import OPERATOR_USER, WORKERS_USER, Credential, Tenant, TenantsFile

_API = "$JS.API"


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


def _object_put(s: Subjects, bucket: str) -> list[str]:
    """Putting objects into a store, nothing that reads their data back.

    An object put publishes chunks and a meta message, looks the name's old meta up by a
    direct get of the meta subject (worker/store.py), and purges replaced or failed chunks.
    Message gets by sequence and direct gets of chunk subjects are left out: they read data.
    """
    stream = s.object_stream(bucket)
    return [
        s.object_subjects(bucket),
        f"{_API}.STREAM.INFO.{stream}",
        f"{_API}.STREAM.PURGE.{stream}",
        f"{_API}.DIRECT.GET.{stream}.{s.object_meta_subjects(bucket)}",
    ]


def tenant_permissions(s: Subjects, tenant: str) -> dict[str, object]:
    """The publish and subscribe allow-lists of one tenant's user."""
    kernels, outputs = s.kernels_store(tenant), s.outputs_store(tenant)
    own_streams = (
        s.work_stream(tenant),
        s.results_stream(tenant),
        s.dead_stream(tenant),
        s.object_stream(kernels),
        s.object_stream(outputs),
    )
    publish = [
        f"{s.prefix}.lease.{tenant}.>",
        s.work_filter(tenant),
        s.result_filter(tenant),  # the coordinator records chunks that ran out of deliveries
        s.kv_subjects(s.jobs_bucket())[:-1] + f"{tenant}.>",  # its own job specs and records
        # Reading back its own jobs' keys (run records): the direct get names the key.
        f"{_API}.DIRECT.GET.{s.kv_stream(s.jobs_bucket())}."
        + s.kv_subjects(s.jobs_bucket())[:-1]
        + f"{tenant}.>",
        s.object_subjects(kernels),
        *(p for stream in own_streams for p in _stream_reads(stream)),
        *_shared_kv_read(s.kv_stream(s.nodes_bucket())),
        # nats-py's object-store get looks its stream up by subject. Stream names carry
        # tenant names, which adverts show anyway: tenant names are not secret.
        f"{_API}.STREAM.NAMES",
    ]
    subscribe = [f"{s.inbox_prefix(tenant)}.>", s.advert_filter()]
    return {"publish": {"allow": publish}, "subscribe": {"allow": subscribe}}


def worker_permissions(s: Subjects, tenants: Iterable[str]) -> dict[str, object]:
    """The node agents' user: serve leases, pull and ack work, publish results, never read them.

    Results are written by publishing to their subject; no grant here reads the results
    streams, and replies go only to the requester's inbox (`allow_responses`).
    """
    shared = (s.nodes_bucket(), s.jobs_bucket(), s.checkpoints_bucket())
    publish = [
        s.advert_filter(),
        f"{s.prefix}.events.>",
        s.kv_subjects(s.nodes_bucket()),
        s.kv_subjects(s.checkpoints_bucket()),
        *(p for bucket in shared for p in _shared_kv_read(s.kv_stream(bucket))),
        f"{_API}.STREAM.NAMES",
    ]
    for tenant in tenants:
        work = s.work_stream(tenant)
        kernels, outputs = s.kernels_store(tenant), s.outputs_store(tenant)
        publish += [
            s.result_filter(tenant),
            f"{_API}.STREAM.INFO.{work}",
            f"{_API}.CONSUMER.INFO.{work}.*",
            f"{_API}.CONSUMER.MSG.NEXT.{work}.*",
            f"$JS.ACK.{work}.>",
            *_shared_kv_read(s.object_stream(kernels)),
            *_object_put(s, outputs),
        ]
    subscribe = [
        f"{s.inbox_prefix(WORKERS_USER)}.>",
        s.advert_filter(),
        f"{s.prefix}.lease.>",
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
    tenants: TenantsFile, subjects: Subjects, *, host: str = "127.0.0.1", port: int = 4222
) -> str:
    """The nats-server config text: JetStream on, and one account holding every user.

    The operator has no permission limits. The config is JSON, which nats-server's
    config parser reads as it is (no escaping rules of our own to get wrong).
    """
    config = {"listen": f"{host}:{port}", "jetstream": {}, "accounts": accounts(tenants, subjects)}
    return json.dumps(config, indent=2)


def accounts(tenants: TenantsFile, subjects: Subjects) -> dict[str, object]:
    """The `accounts` block alone: one JetStream account holding every user (for clusters)."""
    users = [
        _user(OPERATOR_USER, tenants.operator, None),
        _user(
            WORKERS_USER,
            tenants.workers,
            worker_permissions(subjects, [t.name for t in tenants.tenants]),
        ),
        *(_tenant_user(subjects, t) for t in tenants.tenants),
    ]
    return {"FABRIC": {"jetstream": "enabled", "users": users}}


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


async def provision_tenants(operator: BrokerSettings, tenants: TenantsFile) -> None:
    """As the operator, create the shared buckets and every tenant's streams and stores."""
    conn = await connect(operator, name="provision")
    try:
        await topology.provision(conn.js, operator, [t.name for t in tenants.tenants])
    finally:
        await conn.close()
