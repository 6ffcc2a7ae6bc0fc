"""`vramfabric kernel check FILE.cu --entry NAME`: NVRTC from the shell, errors naming the line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nvidia.cuda_nvrtc", reason="NVRTC wheels not installed (the cuda extra)")

GOOD = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n'
BAD = 'extern "C" __global__ void k(float* x) {\n  x[threadIdx.x] = ;\n}\n'


def check(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run the command as a user would."""
    cmd = [sys.executable, "-m", "vramfabric", "kernel", "check", str(path), "--entry", "k"]
    return subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=120)


def test_a_kernel_that_compiles_is_reported_for_each_architecture(tmp_path: Path) -> None:
    # Given a kernel that compiles
    (tmp_path / "good.cu").write_text(GOOD)
    # When it is checked for sm_90
    done = check(tmp_path / "good.cu", "--arch", "sm_90")
    # Then the command says so and exits 0
    assert done.returncode == 0, done.stderr
    assert "k compiles for sm_90" in done.stdout


def test_a_compile_error_names_its_line_in_one_line_without_a_traceback(tmp_path: Path) -> None:
    # Given a kernel with a syntax error on line 2
    (tmp_path / "bad.cu").write_text(BAD)
    # When it is checked
    done = check(tmp_path / "bad.cu")
    # Then the command fails with the compiler's message naming that line, and no traceback
    assert done.returncode == 1
    assert "line 2" in done.stderr and "Traceback" not in done.stderr
    # And a file that does not exist is a usage error
    assert check(tmp_path / "missing.cu").returncode == 2
