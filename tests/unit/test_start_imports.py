"""What each process imports to start (issue 17: a fabric is ready in about 0.5 s on 2 cores).

A worker starts in 0.34 s, most of it imports; modules a process does not need at start
are imported on first use. Each check runs in a fresh interpreter: these tests fail when a
top-level import brings one back (docs/BENCHMARKS.md, Ready, has the cost of each).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
{code}
loaded = [name for name in {absent!r} if name in sys.modules]
print(",".join(loaded))
"""


def imported(code: str, absent: tuple[str, ...]) -> list[str]:
    """Which of `absent` a fresh interpreter has imported after running `code`."""
    script = CHECK.format(code=code, absent=absent)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    return [name for name in done.stdout.strip().split(",") if name]


@pytest.mark.parametrize(
    ("what", "code", "absent"),
    [
        (
            "vramfabric up, before it starts the fabric",
            "import vramfabric.cli as cli; cli.parse(['up']); import vramfabric.local",
            (
                "asyncio",
                "nats",
                "numpy",
                "rich",
                "tenacity",
                "tomllib",
                "vramfabric.broker.tenants",
                "vramfabric.coordinator",
            ),
        ),
        (
            "a worker's agent",
            "import vramfabric.worker.__main__, vramfabric.worker.agent",
            ("numpy", "tenacity", "vramfabric.kernels.cuda", "vramfabric.coordinator"),
        ),
        (
            "an executor",
            "import vramfabric.worker.executor.process",
            ("nats", "asyncio", "tenacity", "prometheus_client"),
        ),
        (
            # Every interactive call's work is this function, by name: loading the client API
            # with it made a fresh fabric's first call take 0.8 s more on 2 cores.
            "an executor's first interactive call",
            "import vramfabric.worker.executor.process, vramfabric.coordinator.calls.remote",
            ("nats", "asyncio", "aiohttp", "tenacity", "prometheus_client"),
        ),
    ],
)
def test_a_process_starts_without_what_it_does_not_need(
    what: str, code: str, absent: tuple[str, ...]
) -> None:
    # Given a fresh interpreter, when it imports what it needs to start
    # Then none of the modules it needs only later (or never) are loaded
    assert imported(code, absent) == [], what


def test_the_full_parser_still_has_every_command() -> None:
    # Given the parser of a client command (not one of the serving ones)
    from vramfabric.cli import build_parser, parse

    # Then it knows every command, and a serving command parses the same either way
    usage = build_parser().format_usage()
    commands = usage[usage.index("{") + 1 : usage.index("}")].split(",")
    assert {"demo", "up", "server", "worker", "run", "status", "jobs", "kernel"} <= set(commands)
    argv = ["-v", "up", "--workers", "1", "--simulate", "1x4GiB"]
    assert vars(parse(argv)) == vars(build_parser().parse_args(argv))
