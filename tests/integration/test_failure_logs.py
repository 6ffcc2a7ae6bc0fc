"""A failed chunk keeps the end of what it printed and its traceback, for the user to read.

In the Python result (`JobResult.failures`) and at the CLI (`vramfabric job ID --failures`),
whether the chunk raised, crashed its executor or hung past its deadline, packed or not; and
only the end of it (64 KiB) when it printed far more.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import AgentFactory, FabricFactory
from vramfabric.broker import BrokerSettings, ErrorKind, RetryPolicy
from vramfabric.coordinator import Fabric, Job
from vramfabric.coordinator.aggregate import Gather
from vramfabric.kernels.cuda import CudaKernel
from vramfabric.worker.executor.captured import TAIL_BYTES

NO_RETRY = RetryPolicy(max_retries=0)

# A CUDA kernel that says something with printf, then fails an assert (on the host path of a
# simulated worker: no GPU needed).
SHOUT = r"""
extern "C" __global__ void shout(const float* x, float* y, unsigned long long n_bytes) {
    if (threadIdx.x == 0) printf("kernel shout: %llu bytes in\n", n_bytes);
    __syncthreads();
    assert(n_bytes == 0);
    y[threadIdx.x] = x[threadIdx.x];
}
"""


def prints_then_raises(x: int) -> int:
    """Prints a line to stdout and one to stderr; chunk 2 then raises."""
    print(f"stdout of chunk {x}: loading the data")
    print(f"stderr of chunk {x}: about to fail", file=sys.stderr)
    if x == 2:
        raise ValueError(f"chunk {x} is broken")
    return x


def floods_then_raises(_x: int) -> None:
    """Prints 10 MiB, then its last words, then raises."""
    line = "x" * 1023 + "\n"
    for _ in range(10 * 1024):
        sys.stdout.write(line)
    sys.stdout.flush()
    print("the last words", file=sys.stderr)
    raise RuntimeError("flooded")


def prints_then_dies(how: str) -> None:
    """Prints to stderr (line-buffered: written at once), then ends its executor or hangs."""
    print(f"before the {how}", file=sys.stderr)
    if how == "crash":
        os._exit(3)  # an executor that dies under the chunk
    time.sleep(600)  # a chunk that hangs past its deadline


def cli(broker: BrokerSettings, *args: str) -> subprocess.CompletedProcess[str]:
    """Run one `vramfabric` command against the test's server and prefix."""
    env = dict(os.environ, VRAMFABRIC_NATS_URL=broker.url, VRAMFABRIC_PREFIX=broker.prefix)
    return subprocess.run(
        [sys.executable, "-m", "vramfabric", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
async def fabric(agent_factory: AgentFactory, fabric_factory: FabricFactory) -> Fabric:
    """A node of 4 slices that runs code, and a fabric."""
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    return await fabric_factory(ack_wait_s=5.0)


@pytest.mark.parametrize("per_message", [1, 10])
async def test_a_failed_chunks_printed_tail_and_traceback_are_in_the_result_and_the_cli(
    fabric: Fabric, broker: BrokerSettings, per_message: int
) -> None:
    # Given chunks that each print to stdout and stderr, and chunk 2 then raises (one chunk
    # per message, or packed)
    job = Job(prints_then_raises, list(range(6)), chunks_per_message=per_message, retry=NO_RETRY)
    # When the job runs
    result = await fabric.run(job, Gather(), slices=2, timeout_s=60)
    # Then the Python result's failure keeps what chunk 2 printed, both streams, and its
    # traceback, naming the function and the exception
    (failure,) = result.failures
    assert failure.index == 2 and failure.error_kind is ErrorKind.ERROR
    assert "stdout of chunk 2: loading the data" in failure.printed
    assert "stderr of chunk 2: about to fail" in failure.printed
    assert "chunk 3" not in failure.printed  # a later chunk's text is not its own
    assert "prints_then_raises" in failure.traceback
    assert failure.traceback.rstrip().endswith("ValueError: chunk 2 is broken")
    # And `vramfabric job ID --failures` shows the same, as text and as JSON
    shown = await asyncio.to_thread(cli, broker, "job", result.job_id, "--failures")
    assert shown.returncode == 0, shown.stderr
    assert "failed chunk 2: error, attempt 1 on n1" in shown.stdout
    assert "stderr of chunk 2: about to fail" in shown.stdout
    assert "ValueError: chunk 2 is broken" in shown.stdout
    as_json = await asyncio.to_thread(cli, broker, "job", result.job_id, "--failures", "--json")
    listed = json.loads(as_json.stdout)
    assert listed["failures_total"] == 1
    assert [(f["index"], f["printed"]) for f in listed["failures"]] == [(2, failure.printed)]


async def test_a_chunk_that_prints_10_mib_keeps_only_the_last_64_kib(
    fabric: Fabric, broker: BrokerSettings
) -> None:
    # Given a chunk that prints 10 MiB, then its last words, then raises
    job = Job(floods_then_raises, [0], retry=NO_RETRY)
    # When it runs
    result = await fabric.run(job, Gather(), slices=1, timeout_s=60)
    # Then its failure keeps the end of what it printed, at most 64 KiB of it
    (failure,) = result.failures
    assert len(failure.printed.encode()) <= TAIL_BYTES
    assert failure.printed.endswith("the last words\n")
    assert failure.printed.count("x" * 1023) > 50
    # And the CLI shows that end too
    shown = await asyncio.to_thread(cli, broker, "job", result.job_id, "--failures")
    assert "the last words" in shown.stdout
    assert len(shown.stdout) < 2 * TAIL_BYTES


@pytest.mark.parametrize("how, kind", [("crash", ErrorKind.CRASHED), ("hang", ErrorKind.TIMEOUT)])
async def test_a_chunk_whose_executor_dies_under_it_keeps_what_it_printed(
    fabric: Fabric, how: str, kind: ErrorKind
) -> None:
    # Given a chunk that prints, then ends its executor (or hangs past a 1 s deadline)
    job = Job(prints_then_dies, [how], retry=NO_RETRY, timeout_s=1.0)
    # When it runs
    result = await fabric.run(job, Gather(), slices=1, timeout_s=60)
    # Then its failure keeps what it printed before, read by the node from the executor
    (failure,) = result.failures
    assert failure.error_kind is kind
    assert f"before the {how}" in failure.printed


async def test_a_cuda_kernels_printf_is_kept_when_it_fails_on_the_host_path(
    fabric: Fabric, broker: BrokerSettings
) -> None:
    # Given a CUDA kernel that prints with printf, then fails an assert
    kernel = CudaKernel(
        name="shout",
        entry="shout",
        source=SHOUT,
        grid=(1,),
        block=(16,),
        args=("in", "out", "in_bytes"),
        max_output_bytes=64,
        max_input_bytes=64,
        output_dtype="float32",
    )
    # When it runs on a simulated worker (the host path)
    result = await fabric.run(
        Job(kernel, [bytes(64)], retry=NO_RETRY), Gather(), slices=1, timeout_s=120
    )
    # Then its failure names the assert and keeps what the kernel printed
    (failure,) = result.failures
    assert "n_bytes == 0" in (failure.error or "")
    assert "kernel shout: 64 bytes in" in failure.printed
    # And `vramfabric job ID --failures` shows it
    shown = await asyncio.to_thread(cli, broker, "job", result.job_id, "--failures")
    assert "kernel shout: 64 bytes in" in shown.stdout
