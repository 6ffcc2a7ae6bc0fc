"""coordinator/jobs/jobfile.py: JOB.toml parsing, the [cuda] table and its errors."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from vramfabric.coordinator.jobs.jobfile import load
from vramfabric.kernels import CudaKernel

SAXPY = """extern "C" __global__ void saxpy(const float* x, float* y, float a, size_t n_bytes) {
    size_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_bytes / 4) y[i] = a * x[i] + 1.0f;
}
"""
SAXPY_PTX = """.version 7.0
.target sm_52
.address_size 64
.visible .entry saxpy(.param .u64 p0, .param .u64 p1, .param .f32 p2, .param .u64 p3)
{
    ret;
}
"""
REFERENCE = """def saxpy(xp, data):
    return (xp.frombuffer(data, dtype=xp.float32) * 2 + 1).astype(xp.float32).tobytes()
"""
CUDA = """
aggregate = "collect"
output_dir = "out"
[inputs]
glob = "inputs/*.bin"
[cuda]
source_file = "saxpy.cu"
entry = "saxpy"
grid = [4]
block = [64, 2]
args = ["in", "out", {f32 = 2.0}, "in_bytes"]
max_output_bytes = 16
"""


def job_dir(tmp_path: Path, toml: str) -> Path:
    """A job folder: the TOML, saxpy.cu and .ptx, two float32 inputs and a reference module."""
    (tmp_path / "saxpy.cu").write_text(SAXPY)
    (tmp_path / "saxpy.ptx").write_text(SAXPY_PTX)
    (tmp_path / "inputs").mkdir()
    for i in range(2):
        (tmp_path / "inputs" / f"{i}.bin").write_bytes(np.array([i, i + 1], np.float32).tobytes())
    (tmp_path / "job.toml").write_text(toml)
    return tmp_path / "job.toml"


def test_a_cuda_job_file_builds_a_cuda_kernel_job(tmp_path: Path) -> None:
    # Given a [cuda] job with a reference module beside the TOML (not on sys.path)
    module = f"ref_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(REFERENCE)
    path = job_dir(
        tmp_path,
        CUDA + f'max_input_bytes = 8\noutput_dtype = "float32"\nreference = "{module}:saxpy"\n',
    )
    path_before = list(sys.path)
    # When it is loaded
    spec = load(path)
    # Then the job runs that CUDA kernel over the globbed inputs
    kernel = spec.job.kernel
    assert isinstance(kernel, CudaKernel)
    assert (kernel.name, kernel.entry, kernel.source) == ("saxpy", "saxpy", SAXPY)
    assert (kernel.grid, kernel.block) == ((4, 1, 1), (64, 2, 1))
    assert kernel.args == ("in", "out", ("f32", 2.0), "in_bytes")
    assert (kernel.max_output_bytes, kernel.max_input_bytes) == (16, 8)
    inputs = spec.job.inputs
    assert isinstance(inputs, list)  # a job file's inputs are read into a list
    assert len(inputs) == 2
    out = kernel.run_reference(np, inputs[1])
    assert np.frombuffer(out, np.float32).tolist() == [3.0, 5.0, 0.0, 0.0]
    # and the job folder was on sys.path only while the reference was imported
    assert sys.path == path_before


def test_a_ptx_job_file_defaults_name_and_optional_fields(tmp_path: Path) -> None:
    toml = CUDA.replace('source_file = "saxpy.cu"', 'ptx_file = "saxpy.ptx"')
    kernel = load(job_dir(tmp_path, toml + 'name = "my-saxpy"\n')).job.kernel
    assert isinstance(kernel, CudaKernel)
    assert (kernel.name, kernel.ptx, kernel.source) == ("my-saxpy", SAXPY_PTX, "")
    assert (kernel.max_input_bytes, kernel.output_dtype, kernel.shared_mem_bytes) == (
        1_000_000,
        "float32",
        0,
    )
    assert kernel.reference is None


@pytest.mark.parametrize(
    "change, message",
    [
        (("", "colour = 3\n"), "unknown key cuda.colour"),
        (('entry = "saxpy"\n', ""), "missing key cuda.entry"),
        (('source_file = "saxpy.cu"\n', ""), "exactly one of cuda.source_file and cuda.ptx_file"),
        (("", 'ptx_file = "saxpy.ptx"\n'), "exactly one of cuda.source_file and cuda.ptx_file"),
        (('"saxpy.cu"', '"nope.cu"'), "cuda.source_file: cannot read"),
        (("grid = [4]", "grid = []"), "cuda.grid must be an array of 1 to 3 ints"),
        (("grid = [4]", "grid = [1, 2, 3, 4]"), "cuda.grid must be an array of 1 to 3 ints"),
        (("block = [64, 2]", 'block = ["a"]'), "cuda.block must be an array of 1 to 3 ints"),
        (("block = [64, 2]", "block = [2048]"), "[cuda] CudaKernel 'saxpy': block: x=2048"),
        (('entry = "saxpy"', "entry = 1"), "cuda.entry must be a string"),
        (("max_output_bytes = 16", 'max_output_bytes = "big"'), "cuda.max_output_bytes must be"),
        (("max_output_bytes = 16", "max_output_bytes = true"), "cuda.max_output_bytes must be"),
        (("max_output_bytes = 16", "max_output_bytes = 0"), "max_output_bytes: must be an int"),
        (("", 'output_dtype = "nope"\n'), "output_dtype: must name a NumPy dtype"),
        (('args = ["in", "out", {f32 = 2.0}, "in_bytes"]', 'args = "in"'), "must be an array"),
        (("{f32 = 2.0}", "{f32 = 2.0, f64 = 1.0}"), "cuda.args[2] must be"),
        (("{f32 = 2.0}", "{f16 = 2.0}"), "args[2]: expected"),
        (("{f32 = 2.0}", "{i32 = 2.0}"), "i32 value must be an integer"),
        (('"in_bytes"]', '"in_bytes", "out"]'), "exactly one 'out'"),
        (("", 'reference = "nope"\n'), "cuda.reference must be 'module:function'"),
        (("", 'reference = "no_such_module_zz:f"\n'), "cuda.reference 'no_such_module_zz:f'"),
        (("", 'reference = "math:nope"\n'), "cuda.reference 'math:nope'"),
        (("", 'reference = "math:pi"\n'), "is not callable"),
        (("^", 'kernel = "hyperparam_eval"\n'), "either key 'kernel' or a [cuda]"),
        (("^", "args = {a = 1}\n"), "key 'args' is for registered kernels"),
        (('glob = "inputs/*.bin"', "grid = 10"), "inputs.grid is the hyperparam_eval"),
    ],
)
def test_bad_cuda_job_files_name_the_key(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    old, new = change
    # "^" puts a top-level key first; "" appends a key to [cuda]
    toml = new + CUDA if old == "^" else CUDA.replace(old, new, 1) if old else CUDA + new
    assert toml != CUDA
    with pytest.raises(ValueError) as info:
        load(job_dir(tmp_path, toml))
    assert message in str(info.value)


@pytest.mark.parametrize(
    "toml, message",
    [
        ('aggregate = "argmin"\ncuda = 3\n[inputs]\nglob = "x"\n', "cuda must be a table"),
        ('aggregate = "argmin"\n[inputs]\nglob = "x"\n', "missing key 'kernel'"),
    ],
)
def test_a_job_needs_a_kernel_or_a_cuda_table(tmp_path: Path, toml: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load(job_dir(tmp_path, toml))


@pytest.mark.parametrize("value", ["-1", "2001", "true", '"4"', "2.5"])
def test_chunks_per_message_must_be_an_integer_in_range(tmp_path: Path, value: str) -> None:
    with pytest.raises(ValueError, match="chunks_per_message must be an integer from 0 to 2000"):
        load(job_dir(tmp_path, f"chunks_per_message = {value}\n" + CUDA))


def test_chunks_per_message_reaches_the_job(tmp_path: Path) -> None:
    path = job_dir(tmp_path, "chunks_per_message = 1\n" + CUDA)
    assert load(path).job.chunks_per_message == 1
    path.write_text(CUDA)
    assert load(path).job.chunks_per_message is None
