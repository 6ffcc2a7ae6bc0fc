"""The hostile host path: correct CUDA runs right, wrong CUDA fails with its line and cause.

Each kernel is one of tests/cuda_hostile_samples.py, written for these tests with its own
NumPy reference. A kernel's first chunk in a process runs in check mode (races, unwritten
shared memory, bounds, two schedules), its later chunks plainly; both are exercised.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cuda_hostile_samples import BAD, GOOD, PRINTF, UNINITIALISED_SHARED, Sample
from vramfabric.kernels import CudaKernel, KernelArgumentError, KernelCompileError, host_build
from vramfabric.kernels.host_cache import HostCache
from vramfabric.kernels.host_faults import KernelFault

RNG_SEED = 29


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # One cache for the module's kernels (each built once), away from other tests'.
    folder = tmp_path_factory.getbasetemp() / "hostile-cache"
    monkeypatch.setenv("VRAMFABRIC_HOST_CACHE", str(folder))


def check_output(sample: Sample, data: bytes, out: bytes) -> None:
    got = np.frombuffer(out, sample.dtype)
    assert sample.reference is not None
    expected = sample.reference(data)
    got = got[: expected.size]
    if sample.rtol:
        np.testing.assert_allclose(got, expected, rtol=sample.rtol, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, expected.astype(sample.dtype))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_correct_kernel_runs_right_in_check_mode_and_plainly(name: str) -> None:
    # Given a correct kernel, written as CUDA users write it, and two chunks of input
    sample = GOOD[name]
    kernel = sample.kernel()
    rng = np.random.default_rng(RNG_SEED)
    chunks = [sample.make_input(rng) for _ in range(2)]
    # When both run on the host path (the first in check mode, the second plainly)
    outs = [kernel.run_host(data) for data in chunks]
    # Then each equals its NumPy reference
    for data, out in zip(chunks, outs, strict=True):
        check_output(sample, data, out)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(BAD))
def test_each_fault_is_caught_in_check_mode_with_its_message(name: str) -> None:
    # Given a kernel that is wrong in one way
    sample = BAD[name]
    data = sample.make_input(np.random.default_rng(RNG_SEED))
    # When a chunk runs in check mode, Then it fails naming the kernel, the cause and the line
    with pytest.raises(KernelFault, match=sample.fault):
        sample.kernel().check_host(data)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "name",
    ["divergent_barrier", "mask_without_self", "inactive_lane", "divide_by_zero",
     "stack_overflow", "past_in", "inter_block_wait"],
)  # fmt: skip
def test_plain_runs_catch_the_same_faults(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given chunks that run plainly (no check mode at all)
    monkeypatch.setenv("VRAMFABRIC_HOST_CHECK", "off")
    sample = BAD[name]
    data = sample.make_input(np.random.default_rng(RNG_SEED))
    # When one runs, Then the fault is reported as in check mode, line and all
    with pytest.raises(KernelFault, match=sample.fault):
        sample.kernel().run_host(data)


@pytest.mark.timeout(300)
def test_a_write_past_out_is_caught_by_its_guard_page_in_a_plain_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VRAMFABRIC_HOST_CHECK", "off")
    sample = BAD["past_out"]
    data = sample.make_input(np.random.default_rng(RNG_SEED))
    with pytest.raises(KernelFault, match=r"kernel copy wrote past `out` .* at line 4 in thread"):
        sample.kernel().run_host(data)


@pytest.mark.timeout(300)
def test_shared_memory_starts_poisoned_in_every_block_of_every_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a kernel that adds into __shared__ memory it never zeroes, run plainly
    monkeypatch.setenv("VRAMFABRIC_HOST_CHECK", "off")
    kernel = BAD["uninitialised_shared"].kernel()
    assert UNINITIALISED_SHARED in kernel.source
    ones = np.ones(256, np.float32).tobytes()
    # When chunks run one after another, Then no block's sum is right (a GPU's would be
    # garbage too): the memory starts as poison, not zero, and not the last chunk's values
    for _ in range(3):
        sums = np.frombuffer(kernel.run_host(ones), np.float32)
        assert not np.isfinite(sums).any() or not np.allclose(sums, 64.0)


@pytest.mark.timeout(300)
def test_kernel_printf_reaches_fd_1_before_the_launch_returns(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Given a kernel that prints one line per block
    kernel = CudaKernel(
        name="hello", entry="hello", source=PRINTF, args=("out",), grid=(3,), block=(32,),
        max_output_bytes=12,
    )  # fmt: skip
    # When a chunk runs
    kernel.run_host(b"")
    # Then each block's line is on the process's stdout already (no stdio buffer holds it)
    printed = capfd.readouterr().out
    assert sorted(re.findall(r"hello from block \d", printed)) == [
        f"hello from block {b}" for b in range(3)
    ]


SCALAR = 'extern "C" __global__ void k(float* out, float a, unsigned long n) { out[0] = a * n; }'


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (("out", ("i32", 3), ("u64", 2)), "args\\[1\\]: \\('i32', 3\\) does not fit `float a`"),
        (("out", ("f32", 3.0), ("i64", -1)), "args\\[2\\]: \\('i64', -1\\) does not fit"),
        (("out", ("f32", 3.0), ("f64", 2.0)), "args\\[2\\]: \\('f64', 2.0\\) does not fit"),
        (("out", ("f32", 3.0), ("u64", 2)), ""),
        (("out", ("f32", 3.0), "in_bytes"), ""),
    ],
)
def test_scalar_args_must_be_of_the_parameters_kind(args: tuple[object, ...], refused: str) -> None:
    # Given a kernel taking a float and an unsigned long, When built with these args
    def build() -> CudaKernel:
        return CudaKernel(
            name="k", entry="k", source=SCALAR, args=args, grid=(1,), block=(1,),
            max_output_bytes=4,
        )  # fmt: skip

    if not refused:
        assert build().entry == "k"
        return
    # Then an int for the float (4.2e-45 on a GPU) or a negative for the unsigned is refused
    with pytest.raises(KernelArgumentError, match=refused):
        build()


@pytest.mark.timeout(300)
def test_a_failed_host_build_is_kept_and_not_compiled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a kernel NVRTC takes but g++ does not (the host header has no __fmul_rz)
    # (a source of its own: another test's failed build of the same text, under another name,
    # is kept in this process too)
    source = (
        'extern "C" __global__ void k(float* out) {\n  out[0] = __fmul_rz(2.0f, 3.0f);\n}\n// k\n'
    )
    cache = HostCache(tmp_path)
    started = time.perf_counter()
    with pytest.raises(KernelCompileError, match=r"k: line 2: error: .*__fmul_rz"):
        host_build.build("k", source, "k", cache)
    first_s = time.perf_counter() - started
    # When 40 chunks' worth of builds follow, in this process and (its memory cleared, as in
    # another process) from the kept failure on disk
    started = time.perf_counter()
    for _ in range(20):
        with pytest.raises(KernelCompileError, match="line 2"):
            host_build.build("k", source, "k", cache)
    monkeypatch.setattr(host_build, "_failed", {})
    for _ in range(20):
        with pytest.raises(KernelCompileError, match="line 2"):
            host_build.build("k", source, "k", cache)
    # Then none compiles again: all 40 together take less than the one g++ run did
    assert time.perf_counter() - started < first_s
