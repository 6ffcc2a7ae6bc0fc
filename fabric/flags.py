"""Flags that several `vramfabric` commands share."""

from __future__ import annotations

import argparse


def add_metrics_port(
    parser: argparse.ArgumentParser, whose: str, default: int | None = None
) -> None:
    """The `--metrics-port [PORT]` flag of a command serving metrics (default: a coordinator)."""
    if default is None:
        from vramfabric.coordinator.metrics import DEFAULT_PORT

        default = DEFAULT_PORT
    parser.add_argument(
        "--metrics-port",
        type=int,
        nargs="?",
        const=default,
        help=f"serve Prometheus metrics ({whose}) on this port ({default} if no "
        "number, 0: any free ports)",
    )
