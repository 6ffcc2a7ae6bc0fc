"""PolicyFile: the tenants' policy a worker follows, read again whenever the file changes.

`vramfabric server --tenants` rewrites the file in place (whole, by rename) when its tenants
file changes, so a tenant added to a running fabric is served without restarting workers.
A file that does not parse is logged once and the policy in force stays.
"""

from __future__ import annotations

import logging

import attrs

from vramfabric.broker import tenants

log = logging.getLogger(__name__)


@attrs.define
class PolicyFile:
    """The policy file at `path` (None: no file, every tenant allowed, no quota)."""

    path: str | None
    _stamp: tenants.FileStamp | None = attrs.field(default=None, init=False)

    def load(self) -> tenants.TenantPolicy:
        """Read the file now; ValueError naming the problem if it does not parse."""
        if self.path is None:
            return tenants.TenantPolicy()
        self._stamp = tenants.file_stamp(self.path)
        return tenants.load_policy(self.path)

    def reread(self) -> tenants.TenantPolicy | None:
        """The new policy if the file changed since it was read and parses; else None."""
        if self.path is None:
            return None
        stamp = tenants.file_stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return None  # moved away for a moment, or unchanged
        try:
            policy = self.load()
        except ValueError as exc:
            log.error("tenants' policy not reloaded; the old one stays: %s", exc)
            return None
        log.info("tenants' policy reloaded path=%s tenants=%d", self.path, len(policy.tenants))
        return policy
