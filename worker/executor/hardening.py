"""Keep a worker's secrets from tenants' code running under the same OS user.

`prctl(PR_SET_DUMPABLE, 0)` makes `/proc/<pid>/environ`, `/proc/<pid>/mem` and ptrace of
this process refused to every other process of the same uid that is not root. The node
agent holds the workers' NATS password in its environment, and tenants' executors are its
children: without this, any tenant's code could read it. Root is not kept out.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

PR_SET_DUMPABLE = 4


def make_undumpable() -> bool:
    """Mark this process not dumpable (Linux); False, logged at debug, where that fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        # The process's own symbols (libc among them): find_library("c") forks ldconfig,
        # 20-40 ms of every worker's and executor's start.
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except OSError as exc:
        log.debug("could not make this process undumpable: %s", exc)
        return False
    return True
