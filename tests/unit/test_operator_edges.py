"""Issue 14: the CLI's edges: bad URLs, job-file limits, plain text output, one-line errors."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from vramfabric import cli, exits, fleet_commands
from vramfabric.broker.settings import BrokerSettings, check_url
from vramfabric.coordinator.jobs.jobfile import GRID_MAX, load
from vramfabric.report import err, print_run


@pytest.mark.parametrize(
    "url, why",
    [
        ("nats://127.0.0.1:4222:99", "the port in '127.0.0.1:4222:99' is not a number"),
        ("http://127.0.0.1:8222", "scheme http:// is not one of nats, tls, ws, wss"),
        ("garbage", "no scheme and no port"),
        ("nats://:4222", "no host"),
        ("nats://h:4222/x", "no path, query or fragment"),
        ("nats://a:4222,nats://b:70000", "'nats://b:70000' is not a NATS URL"),
    ],
)
def test_a_url_nats_cannot_use_is_refused_naming_the_variable(url: str, why: str) -> None:
    # Given VRAMFABRIC_NATS_URL set to something nats-py would fail on late or obscurely
    # When settings are built from the environment
    with pytest.raises(ValueError) as caught:
        BrokerSettings.from_env({"VRAMFABRIC_NATS_URL": url})
    # Then the error names the variable and what is wrong, at once
    assert str(caught.value).startswith("VRAMFABRIC_NATS_URL: ")
    assert why in str(caught.value)


@pytest.mark.parametrize(
    "url", ["nats://127.0.0.1:4222", "127.0.0.1:4222", "tls://h", "ws://h:80,nats://[::1]:1"]
)
def test_urls_nats_accepts_pass(url: str) -> None:
    check_url(url)


def test_a_bad_url_error_shows_no_password() -> None:
    with pytest.raises(ValueError) as caught:
        check_url("nats://alice:s3cret@h:1:2")
    assert "s3cret" not in str(caught.value)


def _job(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(body)
    return path


@pytest.mark.parametrize("grid", [3000, GRID_MAX + 1, 0, '"10"', "true"])
def test_a_grid_past_the_search_space_is_refused_at_load(tmp_path: Path, grid: object) -> None:
    # Given a hyperparam_eval job whose grid leaves the kernel's range (3000 ran 1,705
    # launch_failed chunks before)
    path = _job(
        tmp_path, f'kernel = "hyperparam_eval"\naggregate = "argmin"\n[inputs]\ngrid = {grid}\n'
    )
    # When it is loaded, Then the error names the key and the limit
    with pytest.raises(ValueError, match=f"inputs.grid must be an integer from 1 to {GRID_MAX}"):
        load(path)


def test_the_whole_search_space_loads(tmp_path: Path) -> None:
    path = _job(
        tmp_path, f'kernel = "hyperparam_eval"\naggregate = "argmin"\n[inputs]\ngrid = {GRID_MAX}\n'
    )
    inputs = load(path).job.inputs
    assert isinstance(inputs, list)  # a job file's inputs are read into a list
    assert len(inputs) == GRID_MAX


def test_a_run_report_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    # Given a report holding numpy values and dicts (printed as Python reprs before)
    np = pytest.importorskip("numpy")
    summary = {
        "job_id": "abc",
        "value": (np.int64(996), np.float32(3.5)),
        "ok": 998,
        "failed": 12,
        "resumed": 5,
        "leases_peak": 32,
        "phases_s": {"acquire_s": 0.0171, "total_s": 0.4},
        "failures": ["3: launch_failed: bad"],
    }
    # When it is printed as text
    print_run(summary)
    out = capsys.readouterr().out
    # Then each line is a plain fact: no reprs, no dict braces
    assert out.splitlines() == [
        "job: abc",
        "value: [996, 3.5]",
        "chunks: 998 ok, 12 failed (5 from an earlier run)",
        "leases peak: 32",
        "phases: acquire 0.017s, total 0.400s",
        "failed chunk 3: launch_failed: bad",
        "... and 11 more failed chunks (vramfabric job abc)",
    ]


def test_error_lines_are_one_line_and_not_markup() -> None:
    # Given stderr that is a pipe (rich assumes 80 columns there, as it does here)
    line = "vramfabric run: [cuda] needs exactly one of cuda.source_file and cuda.ptx_file " * 3
    # When a long message with brackets is printed
    with err.capture() as captured:
        err.print(line.strip())
    # Then it comes out whole, on one line, brackets included
    assert captured.get() == line.strip() + "\n"


def _main_with(monkeypatch: pytest.MonkeyPatch, exc: BaseException, *argv: str) -> int:
    def handler(_args: argparse.Namespace) -> int:
        raise exc

    monkeypatch.setattr(fleet_commands, "cmd_jobs", handler)
    return cli.main([*argv, "jobs"])


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    assert _main_with(monkeypatch, KeyboardInterrupt()) == exits.RET_INTERRUPTED == 130
    assert capfd.readouterr().err == "vramfabric jobs: interrupted\n"


def test_ctrl_c_that_cut_an_import_short_is_still_one_line(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # Given Ctrl-C came while a module was half-imported (`up` importing nats-py): importing
    # what depends on it again fails
    monkeypatch.setitem(sys.modules, "vramfabric.report", None)
    # Then the command still says it was interrupted, in one line, and exits 130
    assert _main_with(monkeypatch, KeyboardInterrupt()) == exits.RET_INTERRUPTED
    assert capfd.readouterr().err == "vramfabric jobs: interrupted\n"


def test_an_unexpected_error_is_one_line_unless_verbose(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # Given a command that fails with a bug (not one of the fabric's errors)
    bug = TypeError("unsupported operand")
    # When it runs without -v, Then one line and exit 1; with -v the traceback is raised
    assert _main_with(monkeypatch, bug) == exits.RET_FAILED
    assert capfd.readouterr().err == (
        "vramfabric: internal error: TypeError: unsupported operand (-v shows where)\n"
    )
    with pytest.raises(TypeError):
        _main_with(monkeypatch, bug, "-v")


def test_an_os_error_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    missing = FileNotFoundError(2, "No such file or directory", "tenants.toml")
    assert _main_with(monkeypatch, missing) == exits.RET_FAILED
    assert "Traceback" not in capfd.readouterr().err


def test_an_input_file_past_the_kernels_limit_is_refused_naming_it(tmp_path: Path) -> None:
    # Given a CUDA job whose glob matches a file larger than max_input_bytes
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(char* out) {}\n')
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "a.bin").write_bytes(b"\0" * 64)
    (tmp_path / "inputs" / "b.bin").write_bytes(b"\0" * 65)
    (tmp_path / "job.toml").write_text(
        'aggregate = "gather"\n[cuda]\nsource_file = "k.cu"\nentry = "k"\ngrid = [1]\n'
        'block = [1]\nargs = ["out"]\nmax_output_bytes = 4\nmax_input_bytes = 64\n'
        '[inputs]\nglob = "inputs/*.bin"\n'
    )
    # When it is loaded, then the error names the key, the file and the limit
    with pytest.raises(
        ValueError, match=r"inputs.glob: .*b\.bin is 65 bytes; kernel k takes at most 64"
    ):
        load(tmp_path / "job.toml")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["jobs", "--limit", "abc"], "argument --limit: must be a whole number, not 'abc'"),
        (["jobs", "--limit", "0"], "argument --limit: must be at least 1, not 0"),
        (["gc", "--retention-s", "-5"], "argument --retention-s: must be 0 or more seconds"),
        (["gc", "--retention-s", "nan"], "argument --retention-s: must be 0 or more seconds"),
    ],
)
def test_a_bad_count_or_duration_is_a_usage_error_naming_the_flag(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_several_nodes_need_simulated_gpus_and_say_so_before_connecting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VRAMFABRIC_NATS_URL", "nats://127.0.0.1:1")  # nothing listens
    assert cli.main(["worker", "--nodes", "3"]) == 2
    assert (
        "--nodes runs simulated nodes side by side: give --simulate too" in capsys.readouterr().err
    )
