"""Node agents and executors are not dumpable (prctl), so tenants' code cannot read them.

Tenants' code runs as the worker's OS user; a dumpable agent would show it the workers' NATS
password through /proc/<pid>/environ (or ptrace).

Tests run as root here, and root reads any process's /proc files, dumpable or not; so these
tests check the flag itself (PR_GET_DUMPABLE, from inside each process), not a refused read.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import wait_for_line
from tests.integration.conftest import FabricFactory
from vramfabric.broker import BrokerSettings
from vramfabric.coordinator import Gather, Job

PR_GET_DUMPABLE = 3

# Runs the worker, with a thread reporting the flag once it is 0 (or after 20 s, as it is).
AGENT_PROBE = """
import ctypes, sys, threading, time
from vramfabric.worker.__main__ import main

def report():
    libc, deadline = ctypes.CDLL(None), time.monotonic() + 20
    while libc.prctl(3, 0, 0, 0, 0) != 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # polling interval of a loop with a deadline
    print(f"dumpable={libc.prctl(3, 0, 0, 0, 0)}", flush=True)

threading.Thread(target=report, daemon=True).start()
sys.exit(main(sys.argv[1:]))
"""


def executor_dumpable(_: int) -> int:
    """Run in an executor: this process's dumpable flag."""
    import ctypes

    return int(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl: Linux")


@linux_only
def test_the_node_agent_is_not_dumpable(broker: BrokerSettings) -> None:
    # Given a worker process started as `vramfabric.worker` is
    env = dict(
        os.environ,
        VRAMFABRIC_NATS_URL=broker.url,
        VRAMFABRIC_PREFIX=broker.prefix,
        VRAMFABRIC_NATS_PASSWORD="secret",
    )
    cmd = [sys.executable, "-c", AGENT_PROBE, "--simulate", "1x2GiB", "--node", "probe"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        # When it has started
        line = wait_for_line(proc.stdout, "dumpable=")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]
    # Then the kernel says it is not dumpable
    assert line.strip() == "dumpable=0"


@linux_only
async def test_executors_running_tenant_code_are_not_dumpable(
    worker_process: object, fabric_factory: FabricFactory
) -> None:
    # Given a worker running tenants' code
    worker_process("hardened", "--allow-code")  # type: ignore[operator]
    fabric = await fabric_factory(slice_bytes=2**30)
    # When a tenant's function asks the kernel about its own executor process
    done = await fabric.run(Job(executor_dumpable, [0, 1]), Gather(), timeout_s=60)
    # Then it is not dumpable (exec had made it dumpable again: the executor undid that)
    assert done.ok, done.failures[0].error
    assert done.value == [0, 0]
