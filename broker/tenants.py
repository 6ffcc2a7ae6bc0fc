"""The tenants file: who may use the fabric, their VRAM quota, weight and code permission.

TOML, one table per tenant plus the two service users:

    [operator]                  # full access; provisions streams and buckets
    password = "..."
    [workers]                   # every node agent
    password = "..."
    [tenants.alice]
    password = "..."            # or nkey = "U..." (a public nkey)
    quota = "64GiB"             # optional: fleet-wide VRAM the tenant may lease
    weight = 2                  # optional (default 1): its share under contention
    allow_code = true           # optional (default false): may run Python callables
    storage = "8GiB"            # optional account limits (broker/limits.py; also settable
                                # for every tenant in a [defaults] table)

A password may be a bcrypt hash (`$2a$...`, from `nats server passwd`): nats-server accepts
it. Workers never need credentials: give them a policy file (`write_policy`): the same
`[tenants.<name>]` tables without passwords or nkeys, and no service users.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from .limits import DEFAULT_LIMITS, KEYS, AccountLimits, parse_limits

# The service users' names live with the settings; imported from here too (re-exported).
from .settings import OPERATOR_USER as OPERATOR_USER
from .settings import RESERVED_USERS, parse_size
from .settings import WORKERS_USER as WORKERS_USER
from .subjects import token

log = logging.getLogger(__name__)

# A tenant's account also holds a user of the operator's (provisioning) under this prefix.
RESERVED_PREFIX = "vf_"


@attrs.frozen
class Credential:
    """How one user proves who it is: a password (plain or bcrypt) or a public nkey."""

    password: str | None = None
    nkey: str | None = None

    def __attrs_post_init__(self) -> None:
        """Exactly one of password and nkey."""
        if (self.password is None) == (self.nkey is None):
            raise ValueError("give exactly one of password and nkey")


@attrs.frozen
class Tenant:
    """One tenant: credential, fleet-wide VRAM quota (None: unlimited), weight, code flag."""

    name: str = attrs.field(validator=lambda _i, _a, v: token(v, "tenant"))
    credential: Credential
    quota_bytes: int | None = None
    weight: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))
    allow_code: bool = False
    limits: AccountLimits = DEFAULT_LIMITS


@attrs.frozen
class TenantRules:
    """One tenant's policy alone (what workers read): quota, weight, code flag."""

    name: str = attrs.field(validator=lambda _i, _a, v: token(v, "tenant"))
    quota_bytes: int | None = None
    weight: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))
    allow_code: bool = False


@attrs.frozen
class TenantPolicy:
    """What workers need of the tenants file: quotas, weights and code permission."""

    tenants: Mapping[str, TenantRules] = attrs.field(factory=dict)

    def quota_bytes(self, tenant: str) -> int | None:
        """The tenant's quota; None when unlimited (or when no tenants file is in force)."""
        t = self.tenants.get(tenant)
        return t.quota_bytes if t else None

    def weight(self, tenant: str) -> float:
        """The tenant's weight in the fair share (1 when not listed)."""
        t = self.tenants.get(tenant)
        return t.weight if t else 1.0

    def allows_code(self, tenant: str) -> bool:
        """Whether the tenant may run Python callables (everyone, when no file is in force)."""
        if not self.tenants:
            return True
        t = self.tenants.get(tenant)
        return bool(t and t.allow_code)


@attrs.frozen
class TenantsFile:
    """The parsed tenants file."""

    operator: Credential
    workers: Credential
    tenants: tuple[Tenant, ...]

    @property
    def policy(self) -> TenantPolicy:
        """The policy part, by tenant name."""
        return TenantPolicy(
            {
                t.name: TenantRules(t.name, t.quota_bytes, t.weight, t.allow_code)
                for t in self.tenants
            }
        )

    def tenant(self, name: str) -> Tenant:
        """The tenant of that name; KeyError naming the known ones otherwise."""
        for t in self.tenants:
            if t.name == name:
                return t
        raise KeyError(f"no tenant {name!r} (known: {', '.join(t.name for t in self.tenants)})")


def load(path: str | Path) -> TenantsFile:
    """Read and check a tenants file; ValueError naming the file and the problem."""
    try:
        raw = tomllib.loads(Path(path).read_text())
        return parse(raw)
    except (OSError, tomllib.TOMLDecodeError, ValueError, TypeError) as exc:
        raise ValueError(f"tenants file {path}: {exc}") from None


def parse(raw: Mapping[str, Any]) -> TenantsFile:
    """Build a TenantsFile from parsed TOML."""
    unknown = set(raw) - {"operator", "workers", "tenants", "defaults"}
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}")
    tenants_raw = raw.get("tenants") or {}
    if not isinstance(tenants_raw, Mapping) or not tenants_raw:
        raise ValueError("no [tenants.<name>] table")
    defaults = _defaults(raw.get("defaults"))
    tenants = []
    for name, body in tenants_raw.items():
        if name in RESERVED_USERS or name.startswith(RESERVED_PREFIX):
            raise ValueError(
                f"tenant name {name!r} is reserved (names starting {RESERVED_PREFIX!r})"
            )
        tenants.append(_tenant(name, body, defaults))
    return TenantsFile(
        operator=_credential("operator", raw.get("operator")),
        workers=_credential("workers", raw.get("workers")),
        tenants=tuple(tenants),
    )


def load_policy(path: str | Path) -> TenantPolicy:
    """Read a policy file (or a full tenants file) for workers; ValueError naming the problem.

    A file holding credentials is read too, with a warning: a worker needs none of them.
    """
    try:
        raw = tomllib.loads(Path(path).read_text())
        return parse_policy(raw, str(path))
    except (OSError, tomllib.TOMLDecodeError, ValueError, TypeError) as exc:
        raise ValueError(f"tenants file {path}: {exc}") from None


def parse_policy(raw: Mapping[str, Any], where: str = "tenants file") -> TenantPolicy:
    """Build the policy from parsed TOML; credentials, if present, are checked and dropped."""
    if "operator" in raw or "workers" in raw:
        log.warning("%s holds service credentials; workers need only its policy", where)
        return parse(raw).policy
    unknown = set(raw) - {"tenants", "defaults"}
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}")
    tenants_raw = raw.get("tenants") or {}
    if not isinstance(tenants_raw, Mapping) or not tenants_raw:
        raise ValueError("no [tenants.<name>] table")
    policy = {}
    for name, body in tenants_raw.items():
        if isinstance(body, Mapping) and ("password" in body or "nkey" in body):
            log.warning("%s holds tenants' credentials; workers need only its policy", where)
        policy[name] = _rules(name, body)
    return TenantPolicy(policy)


def policy_text(policy: TenantPolicy) -> str:
    """A policy file's TOML: quotas (bytes), weights and code flags, no credentials."""
    lines = ["# Tenants' policy for workers: no credentials (written from the tenants file)."]
    for name, t in sorted(policy.tenants.items()):
        lines.append(f"[tenants.{name}]")
        if t.quota_bytes is not None:
            lines.append(f"quota = {t.quota_bytes}")
        lines.append(f"weight = {t.weight!r}")
        lines.append(f"allow_code = {'true' if t.allow_code else 'false'}")
    return "\n".join(lines) + "\n"


# What tells a rewritten tenants or policy file from the one read: its modification time,
# size and inode. The time alone misses a rewrite within one tick of the file system's clock
# (a jiffy on ext4, a second or more on some network file systems), as when a hub adds two
# tenants at once; a file replaced by rename has a new inode, one with a tenant added a new size.
FileStamp = tuple[int, int, int]


def file_stamp(path: str | Path) -> FileStamp | None:
    """The file's (mtime in ns, size, inode) now; None if it cannot be read (moved away)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def write_policy(policy: TenantPolicy, path: str | Path) -> Path:
    """Write the policy file workers read (VRAMFABRIC_TENANTS); it holds no secret."""
    out = Path(path)
    # Written whole, then renamed over the old one: a worker reading it on a change never
    # sees half a file.
    partial = out.with_name(f".{out.name}.partial")
    partial.write_text(policy_text(policy))
    partial.replace(out)
    return out


def _credential(what: str, body: Any) -> Credential:
    if not isinstance(body, Mapping):
        raise ValueError(f"[{what}] needs a password or an nkey")
    try:
        return Credential(password=body.get("password"), nkey=body.get("nkey"))
    except ValueError as exc:
        raise ValueError(f"[{what}]: {exc}") from None


def _rules(name: str, body: Any) -> TenantRules:
    if not isinstance(body, Mapping):
        raise ValueError(f"[tenants.{name}] must be a table")
    unknown = set(body) - {"password", "nkey", "quota", "weight", "allow_code", *KEYS}
    if unknown:
        raise ValueError(f"[tenants.{name}]: unknown keys {sorted(unknown)}")
    quota = body.get("quota")
    try:
        return TenantRules(
            name=name,
            quota_bytes=None if quota is None else parse_size(str(quota)),
            weight=float(body.get("weight", 1.0)),
            allow_code=bool(body.get("allow_code", False)),
        )
    except ValueError as exc:
        raise ValueError(f"[tenants.{name}]: {exc}") from None


def _defaults(body: Any) -> AccountLimits:
    """The `[defaults]` table: account limits every tenant gets unless it sets its own."""
    if body is None:
        return DEFAULT_LIMITS
    if not isinstance(body, Mapping):
        raise ValueError("[defaults] must be a table")
    unknown = set(body) - KEYS
    if unknown:
        raise ValueError(f"[defaults]: unknown keys {sorted(unknown)} (known: {sorted(KEYS)})")
    return parse_limits(body, DEFAULT_LIMITS, "defaults")


def _tenant(name: str, body: Any, defaults: AccountLimits) -> Tenant:
    rules = _rules(name, body)
    credential = _credential(f"tenants.{name}", body)
    limits = parse_limits(body, defaults, f"tenants.{name}")
    return Tenant(name, credential, rules.quota_bytes, rules.weight, rules.allow_code, limits)
