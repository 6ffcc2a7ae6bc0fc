"""Hub users' tenants in the tenants file: named from the user, created once, never shared.

A tenant made for a hub user is appended to the tenants file the fabric's server follows
(`vramfabric server --tenants`), with a fresh random password, and recorded as that user's
in an owners file beside it (`<tenants file>.hub.json`: tenant -> hub user name). The
owners file is what keeps two hub users whose names map to one tenant apart, and keeps a
tenant the operator wrote by hand from being handed to whoever logs in under its name.
Both files are replaced whole (written aside, then renamed), under a lock file, so the
server never reads half a file and two spawns never add the same tenant twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

from vramfabric.broker import tenants
from vramfabric.broker.settings import RESERVED_USERS, parse_size
from vramfabric.broker.subjects import token

# Long hub names (e-mail addresses) are cut to this, with a hash of the whole name kept.
MAX_TENANT_CHARS = 48
_OTHER = re.compile(r"[^a-z0-9_-]+")
# Given to a name the fabric reserves (its service users, `vf_...`).
_RESERVED_ESCAPE = "u_"


def tenant_name(hub_user: str) -> str:
    """The tenant a hub user name maps to: a subject token, not one the fabric reserves.

    Lower case; every run of characters other than letters, digits, `_` and `-` becomes
    one `_` (`Alice.Smith@uni.edu` -> `alice_smith_uni_edu`); a name the fabric reserves
    gets `u_` in front; a name longer than 48 characters is cut, with a hash of the whole
    name at its end. Different names can map to one tenant: `HubTenants.claim` refuses
    the second user.

    Raises:
        ValueError: the name has no letter or digit.
    """
    name = _OTHER.sub("_", hub_user.lower()).strip("_")
    if not re.search(r"[a-z0-9]", name):
        raise ValueError(f"hub user {hub_user!r} has no letter or digit to name a tenant after")
    if name in RESERVED_USERS or name.startswith(tenants.RESERVED_PREFIX):
        name = _RESERVED_ESCAPE + name
    if len(name) > MAX_TENANT_CHARS:
        digest = hashlib.sha256(hub_user.encode()).hexdigest()[:8]
        name = f"{name[: MAX_TENANT_CHARS - 9]}_{digest}"
    return token(name, "tenant")


@attrs.frozen
class TenantLogin:
    """A hub user's tenant and its password; `created` when this claim added it."""

    tenant: str
    password: str = attrs.field(repr=False)
    created: bool = False


@attrs.frozen
class TenantDefaults:
    """What a tenant made for a hub user gets: code permission, quota (None: none), weight."""

    allow_code: bool = True
    quota: str | None = attrs.field(default=None)
    weight: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))

    @quota.validator
    def _check_quota(self, _attribute: object, value: str | None) -> None:
        if value is not None:
            parse_size(value)

    def table(self, tenant: str, hub_user: str, password: str) -> str:
        """The tenant's `[tenants.<name>]` table, with a comment naming its hub user."""
        lines = [
            f"# added by vramfabric.jupyterhub for hub user {json.dumps(hub_user)}",
            f"[tenants.{tenant}]",
            f'password = "{password}"',
            f"allow_code = {'true' if self.allow_code else 'false'}",
            f"weight = {self.weight!r}",
        ]
        if self.quota is not None:
            lines.append(f'quota = "{self.quota}"')
        return "\n".join(lines) + "\n"


@attrs.frozen
class HubTenants:
    """The tenants file and its owners file, as the hub edits them."""

    tenants_file: Path = attrs.field(converter=Path)
    defaults: TenantDefaults = attrs.field(factory=TenantDefaults)
    # Hand a tenant the operator wrote by hand (not in the owners file) to the hub user
    # whose name maps to it. Off by default: on a hub where anyone may sign up, whoever
    # picks that name first would get the tenant's password.
    adopt_existing: bool = False
    owners_file: Path = attrs.field(
        converter=Path,
        default=attrs.Factory(lambda s: Path(f"{s.tenants_file}.hub.json"), takes_self=True),
    )

    def claim(self, hub_user: str, tenant: str | None = None) -> TenantLogin:
        """The hub user's tenant (`tenant_name(hub_user)` unless named), added if missing.

        Raises:
            ValueError: the name is taken by another hub user or by a tenant the operator
                wrote (unless `adopt_existing`), the tenant has no plain password to hand
                out, or a file does not read.
        """
        name = tenant if tenant is not None else tenant_name(hub_user)
        token(name, "tenant")
        with self._locked():
            owners = self._owners()
            owner = owners.get(name)
            if owner is not None and owner != hub_user:
                raise ValueError(
                    f"hub user {hub_user!r} maps to tenant {name!r}, which belongs to hub user "
                    f"{owner!r} ({self.owners_file}); rename one of them, or map names "
                    "yourself (FabricTenants(tenant_name=...))"
                )
            file = tenants.load(self.tenants_file)
            existing = next((t for t in file.tenants if t.name == name), None)
            if existing is None:
                return self._add(hub_user, name, owners)
            if owner is None and not self.adopt_existing:
                raise ValueError(
                    f"hub user {hub_user!r} maps to tenant {name!r}, which {self.tenants_file} "
                    "already holds and no hub user owns; it is not handed out "
                    "(FabricTenants(adopt_existing=True) would)"
                )
            password = existing.credential.password
            if password is None or password.startswith("$2"):
                raise ValueError(
                    f"tenant {name!r} logs in with an nkey or a bcrypt hash in "
                    f"{self.tenants_file}: the hub has no password to give hub user {hub_user!r}"
                )
            if owner is None:
                self._write_owners({**owners, name: hub_user})
            return TenantLogin(name, password)

    def _add(self, hub_user: str, name: str, owners: dict[str, str]) -> TenantLogin:
        password = secrets.token_urlsafe(24)
        text = self.tenants_file.read_text()
        if text and not text.endswith("\n"):
            text += "\n"
        text += "\n" + self.defaults.table(name, hub_user, password)
        # Checked before anything is written: a file the server cannot read is never made.
        tenants.parse(tomllib.loads(text))
        # The owner first: a tenant in the file that no owner claims would be refused.
        self._write_owners({**owners, name: hub_user})
        _replace(self.tenants_file, text)
        return TenantLogin(name, password, created=True)

    def _owners(self) -> dict[str, str]:
        try:
            raw = json.loads(self.owners_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ValueError(f"owners file {self.owners_file}: {exc}") from None
        if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
            raise ValueError(f"owners file {self.owners_file}: not a map of tenant to hub user")
        return {str(k): v for k, v in raw.items()}

    def _write_owners(self, owners: dict[str, str]) -> None:
        _replace(self.owners_file, json.dumps(owners, indent=1, sort_keys=True) + "\n")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # A lock file of its own: the two files it guards are replaced, so a lock held on
        # one of them would be on an inode that is gone.
        fd = os.open(f"{self.tenants_file}.hub.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _replace(path: Path, text: str) -> None:
    """Write `text` beside `path`, then rename it over `path`, keeping its mode and owner."""
    try:
        st: os.stat_result | None = path.stat()
    except FileNotFoundError:
        st = None
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        if st is not None:
            os.fchmod(fd, st.st_mode & 0o777)
            if (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
                os.fchown(fd, st.st_uid, st.st_gid)
        out.write(text)
        out.flush()
        os.fsync(fd)
    partial.replace(path)
