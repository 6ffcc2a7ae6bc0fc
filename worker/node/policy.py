"""PolicyFile: the tenants' policy a worker follows, read again whenever the file changes.

`vramfabric server --tenants` rewrites the file in place (whole, by rename) when its tenants
file changes, so a tenant added to a running fabric is served without restarting workers.
A file that does not parse is logged once and the policy in force stays.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import attrs

from vramfabric.broker import tenants

log = logging.getLogger(__name__)


@attrs.define
class PolicyFile:
    """The policy file at `path` (None: no file, every tenant allowed, no quota)."""

    path: str | None
    _mtime_ns: int = attrs.field(default=0, init=False)

    def load(self) -> tenants.TenantPolicy:
        """Read the file now; ValueError naming the problem if it does not parse."""
        if self.path is None:
            return tenants.TenantPolicy()
        self._mtime_ns = self._stamp()
        return tenants.load_policy(self.path)

    def reread(self) -> tenants.TenantPolicy | None:
        """The new policy if the file changed since it was read and parses; else None."""
        if self.path is None or self._stamp() in (0, self._mtime_ns):
            return None
        try:
            policy = self.load()
        except ValueError as exc:
            log.error("tenants' policy not reloaded; the old one stays: %s", exc)
            return None
        log.info("tenants' policy reloaded path=%s tenants=%d", self.path, len(policy.tenants))
        return policy

    def _stamp(self) -> int:
        with contextlib.suppress(OSError):
            return Path(str(self.path)).stat().st_mtime_ns
        return 0
