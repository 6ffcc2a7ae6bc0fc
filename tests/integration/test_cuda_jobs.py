"""CUDA-kernel jobs on simulated workers.

The NumPy reference runs in place of the GPU, only where code is allowed, and
`vramfabric run` takes the kernel from a JOB.toml's [cuda] table.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

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
