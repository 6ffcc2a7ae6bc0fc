"""The `accounts` block of nats-server's config: the fabric's account and one per tenant.

Each tenant's account holds its user, its streams, buckets and stores, and the operator's
user for it; FABRIC holds the operator, the workers, the adverts, the lease services and
the checkpoints. They are joined by narrow imports and exports (why: broker/auth.py).
"""

from __future__ import annotations

from .permissions import fleet_reads, tenant_permissions, worker_paths, worker_permissions
from .subjects import Subjects
from .tenants import OPERATOR_USER, WORKERS_USER, Credential, Tenant, TenantsFile

FABRIC_ACCOUNT = "FABRIC"


def tenant_account(tenant: str) -> str:
    """The NATS account of one tenant (its streams, buckets, stores, inboxes, JetStream API)."""
    return f"TENANT_{tenant}"


def operator_user(tenant: str) -> str:
    """The operator's user inside one tenant's account: it provisions that account's streams."""
    return f"{OPERATOR_USER}_{tenant}"


def accounts(tenants: TenantsFile, subjects: Subjects) -> dict[str, object]:
    """The `accounts` block: the fabric's account and one per tenant, joined by narrow imports.

    What crosses (docs/operations/tenants.md has the picture): lease requests of that tenant to the
    nodes, adverts and reads of the adverts bucket (fabric to tenant); interactive calls of
    that tenant to the nodes, and what they print (fabric to tenant); the work, result, code
    and output paths the workers need (tenant to fabric). A request that crosses is
    answered on a reply subject the server makes, which leads back to the asker's account
    and nowhere else.
    """
    if tenants.operator.password is None:
        raise ValueError(
            "the operator needs a password (it provisions each tenant's account as "
            f"{operator_user('<tenant>')} with it)"
        )
    s = subjects
    fabric_imports: list[dict[str, object]] = []
    out: dict[str, object] = {}
    for tenant in tenants.tenants:
        out[tenant_account(tenant.name)] = _tenant_account(s, tenants, tenant)
        fabric_imports += _workers_imports(s, tenant.name)
    names = [t.name for t in tenants.tenants]
    users = [
        _user(OPERATOR_USER, tenants.operator, None),
        _user(WORKERS_USER, tenants.workers, worker_permissions(s, names)),
    ]
    fabric = {"jetstream": "enabled", "users": users, "exports": _fabric_exports(s, names)}
    fabric["imports"] = fabric_imports
    return {FABRIC_ACCOUNT: fabric, **out}


def _fabric_exports(s: Subjects, names: list[str]) -> list[dict[str, object]]:
    """What FABRIC offers: adverts and the adverts bucket to all, leases and calls to each."""
    every = [tenant_account(n) for n in names]
    return [
        _export("stream", s.advert_filter(), every),
        *(_export("service", sub, every) for sub in fleet_reads(s)),
        *(_export("service", f"{s.prefix}.lease.{n}.>", [tenant_account(n)]) for n in names),
        *(_export("service", s.tenant_calls_filter(n), [tenant_account(n)]) for n in names),
        *(_export("stream", s.call_printed_filter(n), [tenant_account(n)]) for n in names),
    ]


def _workers_imports(s: Subjects, tenant: str) -> list[dict[str, object]]:
    """FABRIC's imports of one tenant's worker paths, under that tenant's API prefix."""
    exported = worker_paths(s, tenant)
    imported = worker_paths(s, tenant, s.tenant_api(tenant))
    return [
        _service(src, tenant_account(tenant), to)
        for (src, _), (to, _) in zip(exported, imported, strict=True)
    ]


def _tenant_account(s: Subjects, tenants: TenantsFile, tenant: Tenant) -> dict[str, object]:
    """One tenant's account: its limits, users, exports to the workers, imports from FABRIC."""
    n = tenant.name
    fleet = fleet_reads(s)
    return {
        # The tenant's own streams count against these too (broker/limits.py); FABRIC
        # (workers, operator, adverts, quota, checkpoints) stays unlimited.
        "jetstream": tenant.limits.jetstream(),
        "limits": tenant.limits.limits(),
        "users": [
            _user(n, tenant.credential, tenant_permissions(s, n)),
            _user(operator_user(n), tenants.operator, None),
        ],
        "exports": [
            _export("service", sub, [FABRIC_ACCOUNT], streams=streams)
            for sub, streams in worker_paths(s, n)
        ],
        "imports": [
            _service(f"{s.prefix}.lease.{n}.>", FABRIC_ACCOUNT),
            _service(s.tenant_calls_filter(n), FABRIC_ACCOUNT),
            {"stream": {"account": FABRIC_ACCOUNT, "subject": s.advert_filter()}},
            {"stream": {"account": FABRIC_ACCOUNT, "subject": s.call_printed_filter(n)}},
            *(
                _service(src, FABRIC_ACCOUNT, to)
                for src, to in zip(fleet, fleet_reads(s, s.fleet_api()), strict=True)
            ),
        ],
    }


def _user(name: str, cred: Credential, permissions: dict[str, object] | None) -> dict[str, object]:
    user: dict[str, object] = (
        {"nkey": cred.nkey} if cred.nkey else {"user": name, "password": cred.password}
    )
    if permissions is not None:
        user["permissions"] = permissions
    return user


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
