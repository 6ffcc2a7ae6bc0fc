"""worker/node/policy.py: a worker sees every rewrite of its tenants' policy file."""

from __future__ import annotations

import os
from pathlib import Path

from vramfabric.broker import tenants
from vramfabric.worker.node.policy import PolicyFile


def policy_of(*names: str) -> tenants.TenantPolicy:
    """A policy listing `names`, each allowed to run code."""
    return tenants.TenantPolicy({n: tenants.TenantRules(n, allow_code=True) for n in names})


def test_a_rewrite_within_one_tick_of_the_clock_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    tenants.write_policy(policy_of("staff"), path)
    policy = PolicyFile(str(path))
    assert set(policy.load().tenants) == {"staff"}
    assert policy.reread() is None  # unchanged
    first = os.stat(path)
    # When a hub adds a tenant, the server rewrites the file (by rename); on a file system
    # whose clock ticks coarsely the new file can carry the old one's modification time.
    tenants.write_policy(policy_of("staff", "alice"), path)
    os.utime(path, ns=(first.st_atime_ns, first.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == first.st_mtime_ns
    reread = policy.reread()
    assert reread is not None and set(reread.tenants) == {"staff", "alice"}
    assert policy.reread() is None


def test_a_policy_file_moved_away_keeps_the_policy_in_force(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    tenants.write_policy(policy_of("staff"), path)
    policy = PolicyFile(str(path))
    policy.load()
    path.rename(tmp_path / "elsewhere.toml")
    assert policy.reread() is None
    tenants.write_policy(policy_of("staff", "bob"), path)
    reread = policy.reread()
    assert reread is not None and set(reread.tenants) == {"staff", "bob"}
