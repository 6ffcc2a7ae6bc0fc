"""The worker's command-line flags (`python -m vramfabric.worker`, `vramfabric worker`).

A module of its own: `vramfabric up` builds its parser with them, and must not import the
agent (nor asyncio) to do so.
"""

from __future__ import annotations

import argparse

# The port `vramfabric worker --metrics-port` serves on when given no number (compose uses it).
DEFAULT_METRICS_PORT = 9100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker's flags (shared with `vramfabric worker`)."""
    parser.add_argument("--simulate", help="simulated GPUs instead of NVML, e.g. 4x48GiB")
    parser.add_argument(
        "--slice", dest="slice_size", help="slice granule, e.g. 512MiB (default 512MiB)"
    )
    parser.add_argument("--node", help="node name (default: host name + random suffix)")
    parser.add_argument("--heartbeat-s", type=float, help="advert interval in seconds")
    parser.add_argument(
        "--metrics-port",
        type=int,
        nargs="?",
        const=DEFAULT_METRICS_PORT,
        help=f"serve Prometheus metrics on this port ({DEFAULT_METRICS_PORT} if no number; 0: any "
        "free port, named on the ready line)",
    )
    parser.add_argument(
        "--kernel-module",
        action="append",
        default=[],
        help="import MODULE and register its KERNELS (repeatable)",
    )
    parser.add_argument(
        "--allow-code",
        action="store_true",
        default=None,
        help=(
            "run tenants' Python callables "
            "(code execution on this node: see docs/operations/execution.md)"
        ),
    )
    parser.add_argument(
        "--allow-shared-uid",
        action="store_true",
        default=None,
        help="DANGEROUS: where executors cannot run as a uid per tenant, run tenants' code as "
        "this worker's own uid (it can then read the worker's credentials and act as it); "
        "without it such a worker refuses tenants' code",
    )
    parser.add_argument(
        "--isolation",
        choices=("thread", "process"),
        help="executor per GPU and tenant with a thread per lease (default), or per lease",
    )
    parser.add_argument(
        "--chunk-timeout-s", type=float, help="deadline of a chunk whose job sets none"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 0 if this node's advert is fresh in KV, else 1"
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="simulated nodes side by side in this process, named NODE-0.. (needs --simulate)",
    )
    # Suppressed default: under `vramfabric -v worker` the top-level count must stand.
    parser.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS)
