#!/usr/bin/env python3
"""await-nats COMMAND...: wait until every NATS server is healthy, then run COMMAND.

compose.yaml's vramfabric containers start through it. A worker that starts before the
JetStream cluster has formed fails for good ('no suitable peers for placement' for its
replicated streams), and not every engine holds a container back until the servers' health
checks pass (podman before 4.6 does not run them at all). Each server in VRAMFABRIC_NATS_URL is
asked for /healthz on its monitoring port (NATS_MONITOR_PORT, 8222): it answers 200 once its
JetStream is current with the cluster's meta leader.

Even then, a stream just created has no leader for a moment, and JetStream answers writes to
it with 'no response from stream': a worker whose start meets that exits with status 3 (it
could not use the servers). A command that exits 3 within START_WINDOW_S of its start is run
again, up to RESTARTS times, each said on stdout. This process stays as the container's first
process and passes SIGTERM and SIGINT on, so a stop reaches the command at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import FrameType
from urllib.parse import urlsplit

DEADLINE_S = float(os.environ.get("NATS_AWAIT_S", "120"))
POLL_S = 0.5
RET_CONNECT = 3  # vramfabric's exit status for servers it could not reach or use
START_WINDOW_S = 60.0
RESTARTS = 5


def healthy(host: str, port: int) -> bool:
    """Whether the server's monitoring port says it is healthy."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=2) as reply:
            return bool(reply.status == 200)
    except (OSError, urllib.error.URLError):  # not up yet, not resolvable yet, or 503
        return False


def await_servers() -> None:
    """Return once every server is healthy, or after DEADLINE_S saying which are not."""
    port = int(os.environ.get("NATS_MONITOR_PORT", "8222"))
    urls = os.environ.get("VRAMFABRIC_NATS_URL", "nats://127.0.0.1:4222").split(",")
    waiting = {urlsplit(url.strip()).hostname or "127.0.0.1" for url in urls}
    deadline = time.monotonic() + DEADLINE_S
    while waiting and time.monotonic() < deadline:
        waiting = {host for host in waiting if not healthy(host, port)}
        if waiting:
            time.sleep(POLL_S)  # polling a server that is starting: nothing to wait on instead
    if waiting:
        # The command still runs: its own error then says what is wrong with the servers.
        print(f"await-nats: not healthy after {DEADLINE_S:.0f} s: {sorted(waiting)}", flush=True)


def run(argv: list[str]) -> int:
    """Run the command, again while it fails to use the servers just after its start."""
    child: subprocess.Popen[bytes] | None = None

    def pass_on(signum: int, _frame: FrameType | None) -> None:
        if child is not None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    for attempt in range(RESTARTS + 1):
        started = time.monotonic()
        child = subprocess.Popen(argv)
        status = child.wait()
        took_s = time.monotonic() - started
        if status != RET_CONNECT or took_s > START_WINDOW_S or attempt == RESTARTS:
            return status if status >= 0 else 128 - status  # killed by a signal: as a shell says
        print(
            f"await-nats: {argv[0]} could not use the servers {took_s:.1f} s after its start: "
            f"starting it again ({attempt + 1}/{RESTARTS})",
            flush=True,
        )
    return RET_CONNECT


def main(argv: list[str]) -> None:
    """Wait for the servers, then run the command and exit with its status."""
    if not argv:
        sys.exit("usage: await-nats COMMAND [ARGS...]")
    await_servers()
    sys.exit(run(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
