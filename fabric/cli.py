"""`vramfabric`: the parser, `main`, and the demo and kernel commands.

`server`, `up` and `worker` are serving.py; `run` is run_command.py; `status`, `jobs`,
`job`, `cancel`, `rm` and `gc` are fleet_commands.py; the exit codes are exits.py. One
cmd_* function per command.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from vramfabric.broker.errors import (
    Disconnected,
    JobCancelled,
    JobNotFound,
    JobTimeout,
    VramfabricError,
)

from . import __version__
from .exits import (
    RET_BROKEN_PIPE,
    RET_CANCELLED,
    RET_CONNECT,
    RET_FAILED,
    RET_INTERRUPTED,
    RET_JOB_FAILED,
    RET_NOT_FOUND,
    RET_OK,
    RET_USAGE,
)
from .flags import add_metrics_port
from .serving import SERVING, add_serving

log = logging.getLogger(__name__)

VERBOSITY = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}


def cmd_demo(args: argparse.Namespace) -> int:
    """Embedded server + simulated workers + a built-in kernel's pattern (the search by default)."""
    from vramfabric.coordinator.metrics import CoordinatorMetrics
    from vramfabric.coordinator.settings import CoordinatorSettings

    from .demo import demo, demo_chunks, print_pattern
    from .report import err, print_demo, progress_bar
    from .run_command import plot, plot_problem, serve_metrics

    if args.plot and (problem := plot_problem(args.plot)):
        err.print(f"vramfabric demo: {problem}")
        return RET_USAGE
    metrics = CoordinatorMetrics()
    workers_port = None
    if args.metrics_port is not None:
        serve_metrics(metrics, args.metrics_port, CoordinatorSettings.from_env().metrics_addr)
        workers_port = args.metrics_port and args.metrics_port + 1
        where = f"ports {workers_port}..{workers_port + args.workers - 1}" if workers_port else ""
        err.print(f"worker metrics: {where or 'free ports'}")
    with progress_bar(not args.json, demo_chunks(args.kernel, args.configs)) as progress:
        summary = demo(
            args.workers,
            args.simulate,
            args.slice,
            args.configs,
            progress,
            args.verbose > 1,
            metrics,
            workers_port,
            with_auth=args.auth,
            port=args.port,
            kernel=args.kernel,
        )
    if args.json:
        print(json.dumps(summary), flush=True)
    elif args.kernel == "hyperparam":
        print_demo(summary)
    else:
        print_pattern(summary)
    ok = (
        summary["failed"] == 0
        and summary["matches_reference"]
        and summary["leased_bytes_after"] == 0
    )
    plotted = plot(summary["series"], args.plot) if args.plot else True
    return (RET_OK if plotted else RET_FAILED) if ok else RET_JOB_FAILED


def build_parser(serving_only: bool = False) -> argparse.ArgumentParser:
    """The argument parser with every subcommand (or only the SERVING ones)."""
    parser = argparse.ArgumentParser(
        prog="vramfabric", description="GPU memory as a pool of leasable VRAM slices."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    if not serving_only:
        _add_demo(sub)
    add_serving(sub)
    if not serving_only:
        _add_client_commands(sub)
    return parser


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `demo` command."""
    p = sub.add_parser("demo", help="embedded fabric + a built-in CUDA kernel's pattern")
    p.add_argument(
        "--kernel",
        default="hyperparam",
        choices=("hyperparam", "montecarlo", "inference", "tiles", "fitness"),
        help="the pattern to run (default hyperparam: the 1000-configuration search)",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--simulate", default="4x80GiB", help="GPUs per worker (default 4x80GiB)")
    p.add_argument("--slice", default="512MiB", help="slice per configuration (default 512MiB)")
    p.add_argument(
        "--configs",
        type=int,
        default=1000,
        choices=range(1, 1001),
        metavar="1..1000",
        help="configurations searched (hyperparam only; default 1000)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    add_metrics_port(p, "the coordinator's; its workers use the ports after it")
    p.add_argument("--plot", metavar="PNG", help="draw leases and chunks done over time here")
    p.add_argument("--auth", action="store_true", help="run with auth on: a generated tenants file")
    p.add_argument("--port", type=int, default=-1, help="server port (default: a free one)")
    p.set_defaults(handler=cmd_demo)


def _add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`run`, `status`, the job commands, `notebook` and `kernel`."""
    from . import kernel_check, notebook
    from .fleet_commands import add_job_commands, cmd_status
    from .run_command import NO_NODES_HINT_S, cmd_run

    p = sub.add_parser("run", help="run a JOB.toml against a running fabric")
    p.add_argument("jobfile")
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout-s", type=float, default=None, help="give up on the job after this")
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="run again the chunks that failed or ran out of retries in an earlier run",
    )
    p.add_argument(
        "--no-wait",
        action="store_true",
        help=f"exit 7 if no node advertises within {NO_NODES_HINT_S:.0f}s (default: wait)",
    )
    add_metrics_port(p, "the coordinator's")
    p.add_argument("--plot", metavar="PNG", help="draw leases and chunks done over time here")
    p.add_argument(
        "--detach",
        action="store_true",
        help="run the job's coordinator in a process that outlives this terminal; print the "
        "job id and log path and return once it drives the job",
    )
    p.add_argument(
        "--log",
        metavar="PATH",
        help="with --detach: the coordinator's log (default "
        "$XDG_STATE_HOME/vramfabric/jobs/JOB.log, else ~/.local/state/vramfabric/jobs/JOB.log)",
    )
    # Set by --detach for the coordinator it starts: stored in the job's origin.
    p.add_argument("--logged-to", help=argparse.SUPPRESS)
    p.set_defaults(handler=cmd_run)
    p = sub.add_parser("status", help="show live nodes, slices free and leased, usage per tenant")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--tenants", help="tenants or policy file (no credentials needed): quotas and weights"
    )
    p.set_defaults(handler=cmd_status)
    add_job_commands(sub)
    notebook.add_parser(sub)
    kernel = sub.add_parser("kernel", help="CUDA kernel tools").add_subparsers(required=True)
    kernel_check.add_parser(kernel)


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse a command line; a SERVING command's without importing the others' modules."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    return build_parser(serving_only=command in SERVING).parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `vramfabric` console script."""
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=VERBOSITY.get(args.verbose, logging.DEBUG),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        return int(args.handler(args))
    except BrokenPipeError:
        return _broken_pipe()
    except BaseException as exc:  # re-raised unless _failed records it as an exit code
        return _failed(args, exc)


def _failed(args: argparse.Namespace, exc: BaseException) -> int:
    """The exit code of a command that raised `exc`, after one line that says why."""
    if isinstance(exc, KeyboardInterrupt):
        # Nothing imported here: Ctrl-C may have cut an import short (`up` importing nats-py),
        # and importing that half-made module again raised a traceback instead of this line.
        print(f"vramfabric {args.command}: interrupted", file=sys.stderr, flush=True)
        return RET_INTERRUPTED
    from .report import err  # rich, only when there is something to say

    try:
        raise exc
    except (VramfabricError, ValueError, OSError) as exc:
        log.info("command failed", exc_info=exc)  # the traceback, with -v
        err.print(f"vramfabric: {_one_line(str(exc))}")
        return next(code for kind, code in _EXIT_CODES if isinstance(exc, kind))
    except Exception as exc:  # recorded as exit 1 with one line (the traceback under -v)
        # A bug: one line, and the traceback only when asked for.
        if args.verbose:
            raise
        err.print(f"vramfabric: internal error: {type(exc).__name__}: {exc} (-v shows where)")
        return RET_FAILED


def _one_line(message: str) -> str:
    """A message's first line and, when it carries a log (nats-server's), its last: the cause."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) <= 1:
        return message.strip()
    head = lines[0].removesuffix(":")
    return f"{head}: ... {lines[-1]} (-v shows all {len(lines)} lines)"


def _broken_pipe() -> int:
    """The reader of stdout went away (`| head`): stop quietly, as SIGPIPE stops other tools."""
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return RET_BROKEN_PIPE


# The exit code of a command that failed, by error; the first match wins.
_EXIT_CODES: tuple[tuple[type[Exception], int], ...] = (
    (Disconnected, RET_CONNECT),
    (JobTimeout, RET_JOB_FAILED),
    (JobNotFound, RET_NOT_FOUND),
    (JobCancelled, RET_CANCELLED),
    (Exception, RET_FAILED),
)


if __name__ == "__main__":
    sys.exit(main())
