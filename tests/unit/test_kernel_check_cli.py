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


def test_more_shared_memory_than_sm_90_gives_is_refused_with_ptxas_figures(
    tmp_path: Path,
) -> None:
    # Given a kernel with dynamic shared memory, launched with 300 KiB of it
    (tmp_path / "dyn.cu").write_text(DYNAMIC)
    # When it is checked for sm_90
    done = check(tmp_path / "dyn.cu", "--arch", "sm_90", "--block", "32", "--shared-mem-bytes",
                 str(300 * 1024))  # fmt: skip
    # Then it fails: sm_90 gives a block at most 227 KiB
    assert done.returncode == 1
    assert "more than sm_90 allows (227 KiB)" in done.stderr


def test_a_kernel_the_host_path_cannot_build_fails_the_check(tmp_path: Path) -> None:
    # Given a kernel NVRTC compiles but the host path cannot (no __fmul_rz there)
    (tmp_path / "rz.cu").write_text(
        'extern "C" __global__ void k(float* x) {\n  x[0] = __fmul_rz(x[0], 2.0f);\n}\n'
    )
    # When it is checked, Then the g++ error is shown with its line
    done = check(tmp_path / "rz.cu", "--arch", "sm_90")
    assert done.returncode == 1
    assert "host path: rz: line 2: error" in done.stderr


def write_job(folder: Path, source: str, entry: str, grid: int, block: int) -> Path:
    """A JOB.toml with a [cuda] table and two input files of 64 floats."""
    (folder / "k.cu").write_text(source)
    (folder / "inputs").mkdir()
    for i in range(2):
        (folder / "inputs" / f"{i}.bin").write_bytes(bytes(range(64)) * 4)
    jobfile = folder / "job.toml"
    jobfile.write_text(
        'aggregate = "gather"\n[inputs]\nglob = "inputs/*.bin"\n[cuda]\n'
        f'source_file = "k.cu"\nentry = "{entry}"\ngrid = [{grid}]\nblock = [{block}]\n'
        'args = ["in", "out"]\nmax_output_bytes = 256\n'
    )
    return jobfile


def test_a_job_files_chunks_run_in_check_mode_and_a_race_is_named(tmp_path: Path) -> None:
    # Given a JOB.toml whose kernel adds into out[0] from every thread without atomics
    jobfile = write_job(tmp_path, LOST_UPDATES, "total", 2, 32)
    # When it is checked
    done = check_job(jobfile)
    # Then its first chunk fails in check mode, naming the kernel, the race and the line
    assert done.returncode == 1, done.stdout
    assert "chunk 0: kernel total: race" in done.stderr and "line 3" in done.stderr


def test_a_clean_job_file_passes_every_check(tmp_path: Path) -> None:
    jobfile = write_job(tmp_path, COPY, "copy", 2, 32)
    done = check_job(jobfile, "--chunks", "2")
    assert done.returncode == 0, done.stderr
    assert "2 chunk(s) ran clean in check mode" in done.stdout


def check_job(jobfile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`vramfabric kernel check JOB.toml` as a user would run it."""
    cmd = [sys.executable, "-m", "vramfabric", "kernel", "check", str(jobfile), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


DYNAMIC = """extern "C" __global__ void k(float* x) {
  extern __shared__ float s[];
  s[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  x[threadIdx.x] = s[31 - threadIdx.x];
}
"""
LOST_UPDATES = """extern "C" __global__ void total(const float* x, float* out) {
  // every thread adds to out[0]: not atomic
  out[0] += x[blockIdx.x * blockDim.x + threadIdx.x];
}
"""
COPY = """extern "C" __global__ void copy(const float* x, float* out) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = 2.0f * x[i];
}
"""
