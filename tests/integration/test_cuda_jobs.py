"""CUDA-kernel jobs on simulated workers.

The NumPy reference runs in place of the GPU, only where code is allowed, and
`vramfabric run` takes the kernel from a JOB.toml's [cuda] table. Kernels without a
reference run on the host path, hostile: correct ones give their reference's answer, wrong
ones fail for good naming what is wrong and where.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from tests.cuda_hostile_samples import BAD, GOOD
from tests.cuda_samples import SAXPY
from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker import BrokerSettings, ErrorKind
from vramfabric.broker.errors import CodeRefused
from vramfabric.coordinator import Fabric, Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.kernels import CudaKernel

CLI = [sys.executable, "-m", "vramfabric"]
MAX_OUTPUT_BYTES = 64  # 16 float32s
# The same reference as a module beside a JOB.toml (imported there, sent by value).
REFERENCE_MODULE = '''
def saxpy(xp, data):
    """2x + 1 over the chunk's float32s."""
    x = xp.frombuffer(data, dtype=xp.float32)
    return (x * xp.float32(2.0) + xp.float32(1.0)).astype(xp.float32).tobytes()
'''


def saxpy_reference(xp: ModuleType, data: bytes) -> bytes:
    """What the CUDA saxpy computes: 2x + 1 over the chunk's float32s."""
    x = xp.frombuffer(data, dtype=xp.float32)
    return bytes((x * xp.float32(2.0) + xp.float32(1.0)).astype(xp.float32).tobytes())


def saxpy(**changes: Any) -> CudaKernel:
    """The saxpy kernel with its reference, as a user would declare it."""
    fields: dict[str, Any] = dict(
        name="saxpy",
        entry="saxpy",
        source=SAXPY,
        grid=(1,),
        block=(16,),
        args=("in", "out", ("f32", 2.0), "in_bytes"),
        max_output_bytes=MAX_OUTPUT_BYTES,
        max_input_bytes=MAX_OUTPUT_BYTES,
        output_dtype="float32",
        reference=saxpy_reference,
    )
    fields.update(changes)
    return CudaKernel(**fields)


def chunk_inputs() -> list[np.ndarray]:
    """Three chunks of float32s; the last is short, so its output is zero-padded."""
    rng = np.random.default_rng(7)
    return [rng.standard_normal(n).astype(np.float32) for n in (16, 16, 10)]


def expected_output(x: np.ndarray) -> np.ndarray:
    """2x + 1 computed directly, padded with zeros to the kernel's output size."""
    out = np.zeros(MAX_OUTPUT_BYTES // 4, dtype=np.float32)
    out[: len(x)] = 2.0 * x + 1.0
    return out


async def test_a_cuda_kernel_job_on_a_simulated_worker_runs_its_reference(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a simulated worker that runs code
    await agent_factory("cuda-ref", allow_code=True)
    fabric = await fabric_factory()
    xs = chunk_inputs()
    # When a CUDA saxpy job runs there
    result = await fabric.run(Job(saxpy(), [x.tobytes() for x in xs]), Gather(), timeout_s=30)
    # Then every chunk is the reference's 2x + 1, zero-padded like the GPU's out buffer
    assert result.ok, result.failures
    assert len(result.value) == len(xs)
    for got, x in zip(result.value, xs, strict=True):
        np.testing.assert_allclose(got, expected_output(x), rtol=1e-6)


async def test_a_kernel_without_a_reference_runs_its_cuda_source_on_a_simulated_worker(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a simulated worker that runs code, and a CUDA kernel with no Python reference
    await agent_factory("cuda-noref", allow_code=True)
    fabric = await fabric_factory()
    xs = chunk_inputs()
    # When it runs
    result = await fabric.run(
        Job(saxpy(reference=None), [x.tobytes() for x in xs]), Gather(), timeout_s=60
    )
    # Then its CUDA source ran, compiled for the CPU, and gave saxpy's answer
    assert result.ok, result.failures
    for got, x in zip(result.value, xs, strict=True):
        np.testing.assert_allclose(got, expected_output(x), rtol=1e-6)


async def refusals(fabric: Fabric, job: Job) -> list[tuple[ErrorKind | None, str, int]]:
    """(kind, message, attempt) of each refusal.

    Whether the fabric refused the job up front (from the workers' adverts; attempt 0) or
    each chunk came back refused by the node.
    """
    try:
        result = await fabric.run(job, Gather(), timeout_s=30)
    except CodeRefused as exc:
        return [(exc.kind, str(exc), 0)]
    assert isinstance(job.inputs, list)  # the tests here pass their inputs as a list
    assert result.n_ok == 0 and result.n_failed == len(job.inputs)
    return [(f.error_kind, f.error or "", f.attempt) for f in result.failures]


async def test_a_simulated_worker_without_allow_code_refuses_a_cuda_kernel(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given only a simulated worker started without --allow-code
    await agent_factory("cuda-nocode")
    fabric = await fabric_factory()
    xs = chunk_inputs()
    # When a CUDA kernel (whose reference is Python code) is sent to it
    refused = await refusals(fabric, Job(saxpy(), [x.tobytes() for x in xs]))
    # Then it is refused, once and for good, naming the flag that would allow it
    assert refused
    for kind, message, attempt in refused:
        assert kind is ErrorKind.CODE_REFUSED
        assert attempt <= 1
        assert "--allow-code" in message


def write_cuda_job(folder: Path, aggregate: str, xs: list[np.ndarray]) -> Path:
    """A JOB.toml with a [cuda] table, its .cu file, reference module and input files."""
    (folder / "saxpy.cu").write_text(SAXPY)
    (folder / "saxpy_ref.py").write_text(REFERENCE_MODULE)
    (folder / "inputs").mkdir()
    for i, x in enumerate(xs):
        (folder / "inputs" / f"{i:03d}.bin").write_bytes(x.tobytes())
    jobfile = folder / "job.toml"
    jobfile.write_text(
        f'aggregate = "{aggregate}"\n'
        f'output_dir = "{folder / "out"}"\n'
        "[inputs]\n"
        'glob = "inputs/*.bin"\n'
        "[cuda]\n"
        'source_file = "saxpy.cu"\n'
        'entry = "saxpy"\n'
        "grid = [1]\n"
        "block = [16]\n"
        'args = ["in", "out", {f32 = 2.0}, "in_bytes"]\n'
        f"max_output_bytes = {MAX_OUTPUT_BYTES}\n"
        f"max_input_bytes = {MAX_OUTPUT_BYTES}\n"
        'output_dtype = "float32"\n'
        'reference = "saxpy_ref:saxpy"\n'
    )
    return jobfile


def run_cli(broker: BrokerSettings, jobfile: Path) -> subprocess.CompletedProcess[str]:
    """`vramfabric run <jobfile> --json` against the test server, from another folder."""
    env = dict(os.environ, VRAMFABRIC_NATS_URL=broker.url, VRAMFABRIC_PREFIX=broker.prefix)
    return subprocess.run(
        [*CLI, "run", str(jobfile), "--json", "--timeout-s", "30"],
        env=env,
        cwd=jobfile.parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def run_cli_in_thread(
    broker: BrokerSettings, jobfile: Path
) -> subprocess.CompletedProcess[str]:
    """`run_cli` in a thread, so the in-process agent keeps serving on this event loop."""
    return await asyncio.to_thread(run_cli, broker, jobfile)


async def test_cli_runs_a_cuda_job_file_and_collects_the_references_outputs(
    agent_factory: AgentFactory, broker: BrokerSettings, tmp_path: Path
) -> None:
    # Given a simulated worker that runs code, and a JOB.toml with a [cuda] table
    await agent_factory("cuda-cli-collect", allow_code=True)
    folder = tmp_path / "job"
    folder.mkdir()
    xs = chunk_inputs()
    jobfile = write_cuda_job(folder, "collect", xs)
    # When `vramfabric run` runs it
    proc = await run_cli_in_thread(broker, jobfile)
    # Then it succeeds, and each collected file is 2x + 1 of its input file
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] == len(xs) and report["failed"] == 0 and report["value"] == len(xs)
    for i, x in enumerate(xs):
        got = np.frombuffer((folder / "out" / f"{i}.bin").read_bytes(), dtype=np.float32)
        np.testing.assert_allclose(got, expected_output(x), rtol=1e-6)


async def test_cli_runs_a_cuda_job_file_and_prints_the_gathered_outputs(
    agent_factory: AgentFactory, broker: BrokerSettings, tmp_path: Path
) -> None:
    # Given a simulated worker that runs code, and a JOB.toml that gathers
    await agent_factory("cuda-cli-gather", allow_code=True)
    folder = tmp_path / "job"
    folder.mkdir()
    xs = chunk_inputs()
    jobfile = write_cuda_job(folder, "gather", xs)
    # When `vramfabric run --json` runs it
    proc = await run_cli_in_thread(broker, jobfile)
    # Then the JSON report holds every chunk's output, as numpy computes it
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] == len(xs) and report["failed"] == 0
    assert len(report["value"]) == len(xs)
    for got, x in zip(report["value"], xs, strict=True):
        np.testing.assert_allclose(np.array(got, dtype=np.float32), expected_output(x), rtol=1e-6)


async def test_cuda_that_the_host_path_refused_runs_right_through_a_job(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a simulated worker that runs code, and kernels of the styles that used to fail
    # there: file-scope extern __shared__, a template by its mangled name, warp intrinsics
    await agent_factory("cuda-hostile-good", allow_code=True)
    fabric = await fabric_factory()
    rng = np.random.default_rng(29)
    for name in ("file_scope_extern_shared", "template_by_mangled_name", "warp_intrinsics"):
        sample = GOOD[name]
        inputs = [sample.make_input(rng) for _ in range(3)]
        # When each runs as a job of three chunks (the first checked, the others plain)
        result = await fabric.run(Job(sample.kernel(), inputs), Gather(), timeout_s=120)
        # Then every chunk equals the kernel's NumPy reference
        assert result.ok, (name, result.failures)
        assert sample.reference is not None
        for data, got in zip(inputs, result.value, strict=True):
            np.testing.assert_array_equal(got, sample.reference(data), err_msg=name)


async def test_a_racy_kernel_fails_its_job_naming_the_race_and_its_line(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a kernel in which every thread adds to out[0] without an atomic
    await agent_factory("cuda-hostile-race", allow_code=True)
    fabric = await fabric_factory()
    sample = BAD["lost_updates"]
    data = sample.make_input(np.random.default_rng(29))
    # When it runs as a job of one chunk
    result = await fabric.run(Job(sample.kernel(), [data]), Gather(), timeout_s=120)
    # Then the chunk fails for good (a launch failure, not retried), naming kernel and line
    assert result.n_failed == 1
    failure = result.failures[0]
    assert failure.error_kind is ErrorKind.LAUNCH_FAILED and failure.attempt == 1
    assert re.search(sample.fault, failure.error or ""), failure.error


async def test_a_kernel_gpp_refuses_fails_each_chunk_at_once_without_rebuilding(
    agent_factory: AgentFactory, fabric_factory: FabricFactory
) -> None:
    # Given a kernel NVRTC takes but the host path cannot build (no __fmul_rz there)
    await agent_factory("cuda-hostile-nobuild", allow_code=True)
    fabric = await fabric_factory()
    source = 'extern "C" __global__ void k(float* out) {\n  out[0] = __fmul_rz(2.0f, 3.0f);\n}\n'
    kernel = CudaKernel(
        name="nobuild", entry="k", source=source, args=("out",), grid=(1,), block=(1,),
        max_output_bytes=4,
    )  # fmt: skip
    # When a job of 40 chunks runs
    started = time.monotonic()
    result = await fabric.run(Job(kernel, [bytes([i]) for i in range(40)]), Gather(), timeout_s=120)
    elapsed_s = time.monotonic() - started
    # Then every chunk fails as load_failed with g++'s line, once each, and the build
    # failure is not compiled again per chunk (the kernel's build happened once, at
    # construction here, so the job takes a fraction of 40 compiles)
    assert result.n_failed == 40
    assert {f.error_kind for f in result.failures} == {ErrorKind.LOAD_FAILED}
    assert all("line 2" in (f.error or "") and f.attempt == 1 for f in result.failures)
    # (0.36 s here; 17 s when each chunk compiled again)
    assert elapsed_s < 10.0, elapsed_s
