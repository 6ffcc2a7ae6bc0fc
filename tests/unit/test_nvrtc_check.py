"""The NVRTC compile check (kernels/nvrtc.py): kernels compile for sm_90; errors name lines."""

from __future__ import annotations

import logging
import sys

import pytest

from tests.cuda_host_samples import SAMPLES
from tests.cuda_hostile_samples import BAD, GOOD, PRINTF
from tests.cuda_samples import SAXPY
from vramfabric.kernels import CudaKernel, hyperparam, nvrtc
from vramfabric.kernels.nvrtc import CudaSourceError, check_source
from vramfabric.kernels.settings import CudaSettings, parse_archs

needs_nvrtc = pytest.mark.skipif(
    nvrtc.nvrtc_module() is None,
    reason="nvrtc not installed (pip install 'vramfabric[cuda]'; .ci/run installs it)",
)
BROKEN = 'extern "C" __global__ void k(float* x) {\n  float y = 1.0f;\n  x[0] = y +;\n}\n'


def kernel(source: str, entry: str = "k") -> CudaKernel:
    return CudaKernel(
        name="k",
        entry=entry,
        grid=(1,),
        block=(1,),
        args=("out",),
        max_output_bytes=4,
        source=source,
    )


@needs_nvrtc
@pytest.mark.timeout(120)
def test_every_builtin_cuda_kernel_compiles_for_sm_90() -> None:
    # Given the built-in CUDA kernels, When compiled for sm_90, Then NVRTC accepts them.
    source = hyperparam.cuda_kernel().source
    assert check_source("hyperparam", source, "hyperparam_eval", ["sm_90"])


@needs_nvrtc
@pytest.mark.parametrize("name", ["saxpy", *SAMPLES])
def test_every_cuda_sample_compiles_for_sm_90(name: str) -> None:
    source, entry = (SAXPY, "saxpy") if name == "saxpy" else SAMPLES[name][:2]
    assert check_source(name, source, entry, ["sm_90"])


@needs_nvrtc
def test_a_compile_error_is_refused_at_construction_with_its_line() -> None:
    with pytest.raises(CudaSourceError, match=r"k: line 3: error: expected an expression"):
        kernel(BROKEN)


@needs_nvrtc
def test_a_compile_error_is_also_an_argument_error_for_callers_that_check_fields() -> None:
    # A JOB.toml loader maps KernelArgumentError (a ValueError) to its own message.
    with pytest.raises(ValueError, match="line 3"):
        kernel(BROKEN)


@needs_nvrtc
def test_a_missing_entry_is_refused() -> None:
    with pytest.raises(CudaSourceError, match="no __global__ function 'nope'"):
        kernel('extern "C" __global__ void k(float* x) {}', entry="nope")


@needs_nvrtc
def test_an_entry_without_extern_c_is_refused_as_a_gpu_could_not_find_it() -> None:
    with pytest.raises(CudaSourceError, match='declare it extern "C"'):
        kernel("__global__ void k(float* x) {}")


@needs_nvrtc
def test_the_archs_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # sm_90 has instructions sm_80 lacks: __cluster_dims__ compiles for sm_90 only.
    source = 'extern "C" __global__ void __cluster_dims__(1, 1, 1) k(float* x) { x[0] = 1; }'
    monkeypatch.setenv("VRAMFABRIC_CUDA_ARCHS", "sm_90")
    assert kernel(source).entry == "k"
    monkeypatch.setenv("VRAMFABRIC_CUDA_ARCHS", "sm_80,sm_90")
    with pytest.raises(CudaSourceError, match="sm_80"):
        kernel(source)


def test_archs_parse_and_default() -> None:
    assert CudaSettings.from_env({}).archs == ("sm_80", "sm_90")
    assert CudaSettings.from_env({"VRAMFABRIC_CUDA_ARCHS": " sm_90 "}).archs == ("sm_90",)
    with pytest.raises(ValueError, match="sm_80,sm_90"):
        parse_archs("compute_90")


def test_without_nvrtc_the_check_is_skipped_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given no cuda.bindings (a None entry makes the import fail) and no warning yet
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)
    monkeypatch.setattr(nvrtc, "_warned", [])
    # When two broken kernels are built
    with caplog.at_level(logging.WARNING, logger="vramfabric.kernels.nvrtc"):
        kernel(BROKEN)
        assert not check_source("k", BROKEN, "k", ["sm_90"])
    # Then nothing is refused, and one warning says why
    nvrtc_records = [r for r in caplog.records if r.name == "vramfabric.kernels.nvrtc"]
    assert [r.getMessage() for r in nvrtc_records] == [
        "nvrtc not installed: CUDA kernels are not compile-checked (pip install 'vramfabric[cuda]')"
    ]


@needs_nvrtc
@pytest.mark.parametrize("name", [*sorted(GOOD), *sorted(BAD), "printf"])
def test_every_hostile_sample_compiles_for_sm_90_with_cudas_headers(name: str) -> None:
    # Given a kernel of the hostile host path's tests (one includes <cuda_fp16.h>)
    source, entry = (PRINTF, "hello") if name == "printf" else (SAMPLES_ALL[name].source, "")
    entry = entry or SAMPLES_ALL[name].entry
    # When NVRTC compiles it for sm_90, Then it is accepted
    assert check_source(name, source, entry, ["sm_90"])


SAMPLES_ALL = {**GOOD, **BAD}
DYNAMIC = """extern "C" __global__ void k(float* x) {
  extern __shared__ float s[];
  s[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  x[threadIdx.x] = s[31 - threadIdx.x];
}
"""
STATIC = DYNAMIC.replace("extern __shared__ float s[]", "__shared__ float s[20000]")


@needs_nvrtc
def test_more_dynamic_shared_memory_than_the_target_allows_is_refused() -> None:
    # Given 300 KiB of dynamic shared memory, When the kernel is built for sm_90
    with pytest.raises(CudaSourceError, match=r"more than sm_90 allows \(227 KiB\)") as refused:
        check_source("k", DYNAMIC, "k", ["sm_90"], threads=32, shared_mem_bytes=300 * 1024)
    # Then the message says what ptxas counted
    assert "ptxas sm_90" in str(refused.value)
    # And 200 KiB is allowed there, but not on sm_80 (163 KiB)
    assert check_source("k", DYNAMIC, "k", ["sm_90"], threads=32, shared_mem_bytes=200 * 1024)
    with pytest.raises(CudaSourceError, match=r"more than sm_80 allows \(163 KiB\)"):
        check_source("k", DYNAMIC, "k", ["sm_80"], threads=32, shared_mem_bytes=200 * 1024)


@needs_nvrtc
def test_a_kernel_ptxas_refuses_shows_ptxas_own_message() -> None:
    # 80,000 bytes of static shared memory: more than the 48 KiB a static array may have
    with pytest.raises(CudaSourceError, match=r"ptxas error: Entry function 'k' uses too much"):
        kernel(STATIC)


@needs_nvrtc
def test_a_kernel_including_cuda_fp16_is_accepted_at_submission() -> None:
    sample = GOOD["half"]
    assert sample.kernel().entry == sample.entry
