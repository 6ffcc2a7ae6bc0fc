"""The generated server config makes room for every tenant's memory limit (broker/auth.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from vramfabric.broker import BrokerSettings, auth, tenants
from vramfabric.broker.limits import DEFAULT_LIMITS
from vramfabric.local import demo_tenants_file


def _jetstream_block(path: Path) -> dict[str, object]:
    text = auth.server_config(tenants.load(path), BrokerSettings().subjects)
    block = json.loads(text)["jetstream"]
    assert isinstance(block, dict)
    return block


def test_few_tenants_leave_the_servers_own_totals(tmp_path: Path) -> None:
    # Given two tenants whose memory limits fit the host many times over
    path = demo_tenants_file(tmp_path / "t.toml", ("a", "b"))
    # Then the server keeps its own JetStream totals
    assert _jetstream_block(path) == {}


def test_more_tenants_than_the_host_holds_get_a_total_that_fits_their_limits(
    tmp_path: Path,
) -> None:
    # Given more tenants than the host's memory holds at the default limit (nats-server sets
    # each account's limit aside and would refuse to start)
    host_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    n = host_bytes // DEFAULT_LIMITS.memory_storage_bytes + 1
    path = demo_tenants_file(tmp_path / "t.toml", tuple(f"s{i}" for i in range(n)))
    # Then the server's memory total is their sum, and room for the fabric's own account
    total = _jetstream_block(path)["max_memory_store"]
    assert isinstance(total, int)
    assert total >= n * DEFAULT_LIMITS.memory_storage_bytes
    assert total - n * DEFAULT_LIMITS.memory_storage_bytes <= 2**30
