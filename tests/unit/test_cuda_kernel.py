"""kernels/cuda*.py, without a GPU.

Validation and signature checks (cuda_checks, cuda_signature), blobs and the lazily
unpickled reference (cuda, cuda_reference), and the GPU path (cuda_compile) against a
stand-in CuPy (the real one runs in tests/gpu).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import attrs
import msgpack
import numpy as np
import pytest

from tests.cuda_samples import SAXPY, SAXPY_PTX
from vramfabric.kernels import (
    CudaKernel,
    KernelArgumentError,
    KernelCompileError,
    ModuleCache,
    NoReference,
)

ARGS = ("in", "out", ("f32", 2.0), "in_bytes")
_OFFSET = 1.0


def _affine(x: Any, a: float) -> Any:
    return x * a + _OFFSET


def saxpy_reference(xp: ModuleType, data: bytes) -> bytes:
    """2x + 1 over the chunk's float32s; uses module globals, so they must travel by value."""
    x = xp.frombuffer(data, dtype=xp.float32)
    return bytes(_affine(x, 2.0).astype(xp.float32).tobytes())


def saxpy(**changes: Any) -> CudaKernel:
    fields: dict[str, Any] = dict(
        name="saxpy",
        entry="saxpy",
        grid=(4, 1, 1),
        block=(128, 1, 1),
        args=ARGS,
        max_output_bytes=64,
        source=SAXPY,
        max_input_bytes=64,
    )
    fields.update(changes)
    return CudaKernel(**fields)


def floats(*values: float) -> bytes:
    return np.array(values, dtype=np.float32).tobytes()


# Validation


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"block": (2048, 1, 1)}, "block: x=2048 outside 1..1024"),
        ({"block": (32, 32, 2)}, "2048 threads; at most 1024"),
        ({"block": (1, 1, 65)}, "block: z=65 outside 1..64"),
        ({"grid": (0, 1, 1)}, "grid: x=0 outside"),
        ({"grid": (1, 65536, 1)}, "grid: y=65536 outside 1..65535"),
        ({"grid": (1, 2, 3, 4)}, "grid: must be 1 to 3 ints"),
        ({"grid": (1.5,)}, "grid: must be 1 to 3 ints"),
        ({"grid": 4}, "grid: must be 1 to 3 ints"),
        ({"args": ("in", "out", "out", "in_bytes")}, "exactly one 'out', got 2"),
        ({"args": ("in", ("f32", 1.0), ("f32", 2.0), "in_bytes")}, "exactly one 'out', got 0"),
        ({"args": ("in", "in", "out")}, "at most one 'in'"),
        ({"args": ("in", "out", ("f16", 1.0), "in_bytes")}, "args[2]: expected"),
        ({"args": ("in", "out", "inout", "in_bytes")}, "args[2]: expected"),
        ({"args": ("in", "out", ("i32", 1.5), "in_bytes")}, "must be an integer"),
        ({"args": ("in", "out", ("u32", -1), "in_bytes")}, "outside the u32 range"),
        ({"args": ("in", "out", ("f32", 1e39), "in_bytes")}, "out of the f32 range"),
        ({"args": ("in", "out", ("f32", True), "in_bytes")}, "must be a number"),
        ({"args": "in"}, "args: must be a sequence"),
        ({"ptx": SAXPY_PTX}, "source/ptx: give exactly one of CUDA source or PTX (both"),
        ({"source": ""}, "(neither is set)"),
        ({"entry": ""}, "entry: must not be empty"),
        ({"max_output_bytes": 0}, "max_output_bytes: must be an int >= 1"),
        ({"max_output_bytes": 6}, "not a whole number of float32 items"),
        ({"output_dtype": "nope"}, "output_dtype: must name a NumPy dtype"),
        ({"output_dtype": "O"}, "output_dtype"),
        ({"shared_mem_bytes": -1}, "shared_mem_bytes: must be an int >= 0"),
        ({"reference": "numpy.sum"}, "reference: must be callable"),
    ],
)
def test_invalid_kernels_are_rejected_naming_the_field(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(KernelArgumentError) as info:
        saxpy(**changes)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_dims_are_padded_and_lists_become_tuples() -> None:
    kernel = saxpy(grid=[8], block=(32, 2), args=["in", "out", ["f32", 2.0], "in_bytes"])
    assert kernel.grid == (8, 1, 1)
    assert kernel.block == (32, 2, 1)
    assert kernel.args == ARGS
    hash(kernel)  # frozen and hashable once lists became tuples


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"args": ("in", "out", ("f32", 2.0))}, "saxpy takes 4 parameters, args has 3"),
        ({"args": ("in", "out", ("f64", 2.0), "in_bytes")}, "does not fit `float a`"),
        ({"args": (("f32", 1.0), "out", ("f32", 2.0), "in_bytes")}, "`const float* x`"),
        ({"args": ("in", "out", ("f32", 2.0), ("i32", 4))}, "`unsigned long long n_bytes`"),
        ({"ptx": SAXPY_PTX, "source": "", "args": ARGS[:3]}, "takes 4 parameters"),
        (
            {"ptx": SAXPY_PTX, "source": "", "args": ("in", "out", ("f64", 2.0), "in_bytes")},
            "does not fit `.param .f32 saxpy_param_2`",
        ),
    ],
)
def test_args_that_do_not_fit_the_entry_signature_are_rejected(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(KernelArgumentError, match="args") as info:
        saxpy(**changes)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "source",
    [
        # a typedef'd pointer: unknown type, so not checked
        'typedef float* fp;\nextern "C" __global__ void saxpy(fp x, fp y, float a, size_t n) {}',
        # template arguments: the signature is not read at all
        "template <typename T, typename U> struct Pair { T t; U u; };\n"
        'extern "C" __global__ void saxpy(Pair<float*, int> p) {}',
        # the entry is produced by a macro
        '#define K(name) extern "C" __global__ void name(float* x)\nK(saxpy) {}',
    ],
)
def test_signatures_that_cannot_be_read_are_left_to_the_compiler(source: str) -> None:
    assert saxpy(source=source).entry == "saxpy"


def test_a_declaration_and_its_definition_are_one_signature() -> None:
    declared = SAXPY.split("{")[0].strip() + ";\n" + SAXPY
    with pytest.raises(KernelArgumentError, match="takes 4 parameters"):
        saxpy(source=declared, args=ARGS[:3])


# Blobs


def test_blob_round_trip_keeps_fields_and_digest() -> None:
    kernel = saxpy(shared_mem_bytes=256, output_dtype="uint8", max_output_bytes=63)
    blob = kernel.to_blob()
    back = CudaKernel.from_blob(blob)
    assert back == kernel
    assert back.to_blob() == blob
    assert (
        back.digest
        == kernel.digest
        == saxpy(shared_mem_bytes=256, output_dtype="uint8", max_output_bytes=63).digest
    )
    assert len(kernel.digest) == 64


def test_digest_changes_with_any_field() -> None:
    digests = {
        saxpy().digest,
        saxpy(grid=(5, 1, 1)).digest,
        saxpy(args=("in", "out", ("f32", 3.0), "in_bytes")).digest,
        saxpy(source=SAXPY + "\n").digest,
        saxpy(reference=saxpy_reference).digest,
    }
    assert len(digests) == 5


def test_reference_travels_by_value_to_a_process_that_cannot_import_it(tmp_path: Path) -> None:
    # Given a kernel whose reference lives in this test file, as a blob on disk
    kernel = saxpy(reference=saxpy_reference)
    blob_path = tmp_path / "kernel.blob"
    blob_path.write_bytes(kernel.to_blob())
    data = floats(1.0, 2.0, -3.5)
    # When a fresh interpreter, without this test's folder on its path, runs it
    child = (
        "import importlib.util, sys, numpy\n"
        "from vramfabric.kernels import CudaKernel\n"
        "try:\n"
        "    found = importlib.util.find_spec(sys.argv[2]) is not None\n"
        "except ModuleNotFoundError:\n"
        "    found = False\n"
        "assert not found, 'the test module must not be importable here'\n"
        "kernel = CudaKernel.from_blob(open(sys.argv[1], 'rb').read())\n"
        "sys.stdout.write(kernel.run_reference(numpy, bytes.fromhex(sys.argv[3])).hex())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", child, str(blob_path), saxpy_reference.__module__, data.hex()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    # Then it computes what the reference computes here
    assert proc.returncode == 0, proc.stderr
    out = np.frombuffer(bytes.fromhex(proc.stdout), dtype=np.float32)
    np.testing.assert_allclose(out[:3], [3.0, 5.0, -6.0])
    assert bytes.fromhex(proc.stdout) == kernel.run_reference(np, data)


def test_from_blob_does_not_unpickle_the_reference() -> None:
    # Given a blob whose pickled reference is garbage
    body = msgpack.unpackb(saxpy(reference=saxpy_reference).to_blob())
    body["reference"] = b"not a pickle"
    kernel = CudaKernel.from_blob(msgpack.packb(body))
    # Then parsing worked, and only running the reference fails, as a load failure
    with pytest.raises(KernelCompileError, match="did not unpickle") as info:
        kernel.run_reference(np, b"")
    assert "UnpicklingError" in info.value.log


def test_a_reference_from_another_python_names_both_versions() -> None:
    body = msgpack.unpackb(saxpy(reference=saxpy_reference).to_blob())
    body["python"] = "2.7"
    kernel = CudaKernel.from_blob(msgpack.packb(body))
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    with pytest.raises(KernelArgumentError, match=rf"Python 2\.7; this worker runs Python {here}"):
        kernel.run_reference(np, b"")


@pytest.mark.parametrize(
    "blob, message",
    [
        (b"\xc1junk", "not a CudaKernel blob"),
        (msgpack.packb([1, 2]), "not a CudaKernel blob"),
        (msgpack.packb({"kind": "python"}), "kind 'python'"),
        (msgpack.packb({"kind": "cuda", "name": "k"}), "lacks entry, grid, block, args"),
        (
            msgpack.packb({**msgpack.unpackb(saxpy().to_blob()), "grid": "big"}),
            "grid: must be 1 to 3 ints",
        ),
        (msgpack.packb({**msgpack.unpackb(saxpy().to_blob()), "reference": 3}), "reference"),
    ],
)
def test_bad_blobs_are_kernel_argument_errors(blob: bytes, message: str) -> None:
    with pytest.raises(KernelArgumentError) as info:
        CudaKernel.from_blob(blob)
    assert message in str(info.value)


# The reference path (simulated GPUs)


def test_reference_output_is_padded_like_the_gpu_buffer() -> None:
    out = saxpy(reference=saxpy_reference).run_reference(np, floats(1.0, 2.0))
    assert len(out) == 64
    assert np.frombuffer(out, np.float32).tolist() == [3.0, 5.0] + [0.0] * 14


def test_no_reference_says_where_to_run_it() -> None:
    with pytest.raises(NoReference) as info:
        saxpy().run_reference(np, b"")
    message = str(info.value)
    assert "kernel 'saxpy' has no xp reference" in message
    assert "run it on a GPU worker or give the kernel a reference" in message


def test_reference_size_limits_name_both_sizes() -> None:
    kernel = saxpy(reference=saxpy_reference, max_input_bytes=8, max_output_bytes=4)
    with pytest.raises(KernelArgumentError, match="input of 12 bytes exceeds max_input_bytes=8"):
        kernel.run_reference(np, floats(1, 2, 3))
    with pytest.raises(KernelArgumentError, match="output of 8 bytes exceeds max_output_bytes=4"):
        kernel.run_reference(np, floats(1, 2))


def test_a_reference_value_error_is_an_argument_error() -> None:
    def picky(xp: ModuleType, data: bytes) -> bytes:
        raise ValueError("input must hold whole float32s")

    with pytest.raises(KernelArgumentError, match="saxpy: input must hold whole float32s"):
        saxpy(reference=picky).run_reference(np, b"abc")


def test_compile_errors_keep_their_log_through_pickling() -> None:
    exc = pickle.loads(pickle.dumps(KernelCompileError("k did not compile", "error: x")))
    assert (str(exc), exc.log) == ("k did not compile", "error: x")


# The GPU path, against a stand-in CuPy that runs the saxpy with NumPy


class DeviceArray(np.ndarray):
    """A NumPy array with CuPy's `get()`."""

    def get(self) -> np.ndarray:
        """A host copy, as `cupy.ndarray.get()` gives."""
        return np.asarray(self)


class FakeCompileError(Exception):
    """Stands in for `cupy.cuda.compiler.CompileException`."""


class FakeDriverError(Exception):
    """Stands in for `cupy.cuda.driver.CUDADriverError`, with its status code."""

    def __init__(self, status: int) -> None:
        super().__init__(f"CUDA_ERROR {status}")
        self.status = status


@attrs.define
class FakeFunction:
    """A loaded kernel: runs the saxpy on NumPy, or raises `launch_error`."""

    cupy: FakeCupy
    ptr: int = 1234

    @property
    def kernel(self) -> FakeFunction:
        """The function itself, as CuPy's `RawKernel.kernel` gives."""
        return self

    def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int = 0) -> None:
        """Record the launch, then run it (or raise the configured driver error)."""
        self.cupy.launches.append((grid, block, args, shared_mem))
        if self.cupy.launch_error is not None:
            raise FakeDriverError(self.cupy.launch_error)
        x, y, a, n_bytes = args
        n = int(n_bytes) // 4
        y.view(np.float32)[:n] = a * np.frombuffer(x.tobytes()[: n * 4], np.float32) + 1.0


@attrs.define
class FakeCupy:
    """Just enough of CuPy's surface for CudaKernel.launch and ModuleCache."""

    device: int = 0
    compile_error: str | None = None
    load_error: int | None = None
    launch_error: int | None = None
    loads: list[tuple[str, Any]] = attrs.field(factory=list)
    launches: list[Any] = attrs.field(factory=list)
    attributes: list[tuple[int, int, int]] = attrs.field(factory=list)

    def module(self) -> Any:
        """The stand-in `cupy` module."""
        driver = SimpleNamespace(CUDADriverError=FakeDriverError, funcSetAttribute=self._attr)
        return SimpleNamespace(
            uint8=np.uint8,
            zeros=lambda n, dtype: np.zeros(n, dtype).view(DeviceArray),
            asarray=lambda a: np.array(a).view(DeviceArray),
            RawModule=lambda code: SimpleNamespace(get_function=lambda e: self._get(code, e)),
            cuda=SimpleNamespace(
                runtime=SimpleNamespace(getDevice=lambda: self.device),
                compiler=SimpleNamespace(CompileException=FakeCompileError),
                driver=driver,
                function=SimpleNamespace(Module=lambda: self._ptx_module()),
                get_current_stream=lambda: SimpleNamespace(synchronize=lambda: None),
            ),
        )

    def _get(self, code: Any, entry: str) -> FakeFunction:
        self.loads.append((entry, code))
        if self.compile_error is not None:
            raise FakeCompileError(self.compile_error)
        if self.load_error is not None:
            raise FakeDriverError(self.load_error)
        return FakeFunction(self)

    def _ptx_module(self) -> Any:
        loaded: list[bytes] = []
        return SimpleNamespace(load=loaded.append, get_function=lambda e: self._get(loaded[0], e))

    def _attr(self, ptr: int, attribute: int, value: int) -> None:
        self.attributes.append((ptr, attribute, value))


def test_launch_passes_typed_args_and_returns_the_whole_out_buffer() -> None:
    # Given a stand-in GPU
    fake = FakeCupy()
    cupy, modules = fake.module(), ModuleCache(fake.module())
    # When the saxpy runs on two floats
    out = saxpy().launch(cupy, floats(1.0, 2.0), modules)
    # Then the output is the out buffer, the args were typed as the kernel said
    assert np.frombuffer(out, np.float32).tolist() == [3.0, 5.0] + [0.0] * 14
    grid, block, args, shared_mem = fake.launches[0]
    assert (grid, block, shared_mem) == ((4, 1, 1), (128, 1, 1), 0)
    assert [type(a).__name__ for a in args] == ["DeviceArray", "DeviceArray", "float32", "uint64"]
    assert len(args[1]) == 64
    # and it matches the reference
    assert out == saxpy(reference=saxpy_reference).run_reference(np, floats(1.0, 2.0))


def test_an_empty_input_gets_a_one_byte_buffer() -> None:
    fake = FakeCupy()
    out = saxpy().launch(fake.module(), b"", ModuleCache(fake.module()))
    _, _, (x, _, _, n_bytes), _ = fake.launches[0]
    assert (len(x), int(n_bytes)) == (1, 0)
    assert out == bytes(64)


def test_modules_compile_once_per_kernel_and_device() -> None:
    fake = FakeCupy()
    cupy, modules = fake.module(), ModuleCache(fake.module())
    for _ in range(3):
        saxpy().launch(cupy, floats(1.0), modules)
    fake.device = 1
    saxpy().launch(cupy, floats(1.0), modules)
    saxpy(grid=(2, 1, 1)).launch(cupy, floats(1.0), modules)
    assert [entry for entry, _ in fake.loads] == ["saxpy"] * 3
    assert len(fake.launches) == 5


def test_ptx_is_loaded_from_its_text() -> None:
    fake = FakeCupy()
    kernel = saxpy(source="", ptx=SAXPY_PTX)
    kernel.launch(fake.module(), floats(1.0), ModuleCache(fake.module()))
    assert fake.loads == [("saxpy", SAXPY_PTX.encode())]


def test_a_compile_error_carries_the_log_and_is_not_compiled_again() -> None:
    fake = FakeCupy(compile_error='kern.cu(3): error: identifier "oops" is undefined')
    modules = ModuleCache(fake.module())
    for _ in range(2):
        with pytest.raises(KernelCompileError, match="NVRTC could not compile") as info:
            saxpy().launch(fake.module(), b"", modules)
        assert '"oops" is undefined' in info.value.log
    assert len(fake.loads) == 1


def test_a_missing_entry_is_a_compile_error() -> None:
    fake = FakeCupy(load_error=500)
    with pytest.raises(KernelCompileError, match=r"no entry 'saxpy'.*extern \"C\""):
        saxpy().launch(fake.module(), b"", ModuleCache(fake.module()))


def test_a_refused_launch_is_an_argument_error_and_other_cuda_errors_propagate() -> None:
    fake = FakeCupy(launch_error=1)
    with pytest.raises(KernelArgumentError, match=r"refused grid=\(4, 1, 1\) block=\(128, 1, 1\)"):
        saxpy().launch(fake.module(), b"", ModuleCache(fake.module()))
    fake.launch_error = 700  # CUDA_ERROR_ILLEGAL_ADDRESS: sticky, the executor must die
    with pytest.raises(FakeDriverError):
        saxpy().launch(fake.module(), b"", ModuleCache(fake.module()))


def test_large_dynamic_shared_memory_is_opted_in() -> None:
    fake = FakeCupy()
    saxpy(shared_mem_bytes=96 * 1024).launch(fake.module(), b"", ModuleCache(fake.module()))
    assert fake.attributes == [(1234, 8, 96 * 1024)]
    assert fake.launches[0][3] == 96 * 1024


def test_launch_checks_the_input_size_before_compiling() -> None:
    fake = FakeCupy()
    with pytest.raises(KernelArgumentError, match="input of 68 bytes exceeds max_input_bytes=64"):
        saxpy().launch(fake.module(), bytes(68), ModuleCache(fake.module()))
    assert fake.loads == []
