"""The host path's caches, and registered kernels that run their CUDA version on it.

kernels/host_cache.py and kernels/prebuild.py: one build per node, the node's built-ins
folder; worker/executor/work_runner.py: a registered kernel's CUDA version on a simulated GPU, its
reference where there is no g++.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cuda_samples import SAXPY
from vramfabric.broker.errors import ErrorKind
from vramfabric.kernels import (
    CudaKernel,
    Kernel,
    Registry,
    builtin_registry,
    host_build,
    hyperparam,
)
from vramfabric.kernels.code import Context
from vramfabric.kernels.host_cache import UNUSED_S, HostCache
from vramfabric.kernels.prebuild import prebuild
from vramfabric.kernels.settings import CudaSettings
from vramfabric.worker.executor import ipc
from vramfabric.worker.executor.work_runner import Failure, WorkRunner

RNG_SEED = 1616
HYPERPARAM_RTOL = 2e-6  # the host path's float32 sums run in another order than NumPy's


def run_builtin(runner: WorkRunner, kernel: Kernel, data: bytes) -> bytes:
    """What an executor does with one `run` frame of a registered kernel."""
    frame = ipc.Run(
        kind="builtin",
        name=kernel.name,
        digest=kernel.digest,
        input=data,
        slice_bytes=2**30,
        job="j",
        index=0,
        attempt=1,
    )
    ctx = Context(device=None, slice_bytes=2**30, xp=np, attempt=1, job="j", index=0)
    return runner.execute(frame, ctx)


def test_concurrent_makers_of_one_file_wait_for_one(tmp_path: Path) -> None:
    # Given 4 threads that need the same new file at once
    cache, made, paths = HostCache(tmp_path / "own"), [], []
    start = threading.Barrier(4)

    def produce(path: Path) -> None:
        made.append(path)
        time.sleep(0.2)  # a slow build: the others must wait for it, not start their own
        path.write_bytes(b"library")

    def need() -> None:
        start.wait()
        paths.append(cache.make("k.so", produce))

    threads = [threading.Thread(target=need) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then one of them made it and all four got it, whole
    assert len(made) == 1 and len(set(paths)) == 1
    assert paths[0].read_bytes() == b"library"
    assert (tmp_path / "own").stat().st_mode & 0o777 == 0o700


def test_a_failed_make_leaves_no_file(tmp_path: Path) -> None:
    cache = HostCache(tmp_path)

    def fail(path: Path) -> None:
        path.write_bytes(b"half")
        raise ValueError("g++ failed")

    with pytest.raises(ValueError):
        cache.make("k.so", fail)
    assert cache.find("k.so") is None and not list(tmp_path.glob("*.tmp"))


def test_a_builtins_folder_others_may_write_is_not_trusted(tmp_path: Path) -> None:
    builtins = tmp_path / "builtins"
    builtins.mkdir()
    (builtins / "k.so").write_bytes(b"planted")
    cache = HostCache(tmp_path / "own", builtins)
    assert cache.find("k.so") == builtins / "k.so"
    builtins.chmod(0o777)
    assert cache.find("k.so") is None


def test_executors_find_the_nodes_prebuilt_library_and_build_nothing(tmp_path: Path) -> None:
    # Given the agent's prebuild of the built-in kernels into the node's folder
    agent = CudaSettings(host_cache=tmp_path / "agent", host_builtins=tmp_path / "builtins")
    assert prebuild(builtin_registry(), agent) == ["hyperparam_eval"]
    assert (tmp_path / "builtins").stat().st_mode & 0o777 == 0o755
    # When an executor with a cache of its own needs the hyperparam kernel's library
    executor = CudaSettings(host_cache=tmp_path / "executor", host_builtins=tmp_path / "builtins")
    kernel = hyperparam.cuda_kernel()
    library = host_build.build(kernel.name, kernel.source, kernel.entry, executor.cache())
    # Then it is the node's, and nothing was built in the executor's own folder
    assert library.parent == tmp_path / "builtins"
    assert not (tmp_path / "executor").exists() or not list((tmp_path / "executor").glob("*.so"))


def test_the_registered_hyperparam_kernel_runs_its_cuda_source_on_a_simulated_gpu() -> None:
    # Given a simulated executor and the demo's configurations
    runner = WorkRunner(builtin_registry, simulated=True)
    kernel = hyperparam.HYPERPARAM_EVAL
    configs = hyperparam.search_space(1000)
    picks = np.random.default_rng(RNG_SEED).choice(len(configs), 20, replace=False)
    for i in [996, *picks.tolist()]:
        data = hyperparam.encode_config(*configs[i])
        out = run_builtin(runner, kernel, data)
        # Then it gives hyperparam.cu's bytes on the host path, the reference's within 2e-6
        assert out == hyperparam.cuda_kernel().run_host(data)
        np.testing.assert_allclose(
            np.frombuffer(out, np.float32),
            np.frombuffer(kernel.run(np, {}, data), np.float32),
            rtol=HYPERPARAM_RTOL,
        )


def test_an_invalid_configuration_fails_as_launch_failed_not_nan() -> None:
    runner = WorkRunner(builtin_registry, simulated=True)
    with pytest.raises(Failure, match="batch_size 0 outside") as info:
        run_builtin(runner, hyperparam.HYPERPARAM_EVAL, hyperparam.encode_config(0.001, 0, 0.1))
    assert info.value.kind is ErrorKind.LAUNCH_FAILED


def doubled(xp: object, args: object, data: bytes) -> bytes:
    """The reference of `twice`: each float32 times two (its CUDA version adds one more)."""
    return (np.frombuffer(data, np.float32) * np.float32(2.0)).tobytes()


def twice_kernel() -> Kernel:
    """A registered kernel whose CUDA version (SAXPY, a = 2) differs from its reference by 1."""

    def cuda() -> CudaKernel:
        return CudaKernel(
            name="twice",
            entry="saxpy",
            grid=(1,),
            block=(32,),
            args=("in", "out", ("f32", 2.0), "in_bytes"),
            max_output_bytes=16,
            max_input_bytes=16,
            source=SAXPY,
        )

    return Kernel("twice", doubled, 16, 16, source=SAXPY, entry="saxpy", cuda=cuda)


def test_without_gpp_a_registered_kernel_runs_its_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a machine with no g++ (nothing on PATH) and an empty host cache
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("VRAMFABRIC_HOST_CACHE", str(tmp_path / "cache"))
    host_build._compiler.cache_clear()
    try:
        kernel = twice_kernel()
        runner = WorkRunner(lambda: Registry({"twice": kernel}), simulated=True)
        data = np.arange(4, dtype=np.float32).tobytes()
        # When the executor runs it, Then the reference answers (x * 2, not SAXPY's x * 2 + 1)
        assert np.frombuffer(run_builtin(runner, kernel, data), np.float32).tolist() == [
            0.0, 2.0, 4.0, 6.0,
        ]  # fmt: skip
    finally:
        host_build._compiler.cache_clear()


def test_with_gpp_a_registered_kernel_runs_its_cuda_version() -> None:
    kernel = twice_kernel()
    runner = WorkRunner(lambda: Registry({"twice": kernel}), simulated=True)
    data = np.arange(4, dtype=np.float32).tobytes()
    out = np.frombuffer(run_builtin(runner, kernel, data), np.float32)
    assert out.tolist() == [1.0, 3.0, 5.0, 7.0]


def test_prune_deletes_what_no_one_used_and_keeps_what_was_found(tmp_path: Path) -> None:
    # Given a cache with two libraries built long ago
    cache = HostCache(tmp_path / "own")
    for name in ("old.so", "used.so"):
        cache.make(name, lambda p: p.write_bytes(b"lib"))
        long_ago = time.time() - 40 * 86_400
        os.utime(tmp_path / "own" / name, (long_ago, long_ago))
    # When one of them is looked up (a process loads it), and the cache is pruned
    assert cache.find("used.so") is not None
    gone = cache.prune(UNUSED_S, time.time())
    # Then only the unused one is deleted; the used one is still found
    assert [p.name for p in gone] == ["old.so"]
    assert cache.find("old.so") is None and cache.find("used.so") is not None


def test_a_builtin_is_built_in_the_nodes_folder_only_where_this_uid_owns_it(
    tmp_path: Path,
) -> None:
    # A shared-uid executor builds the node's own kernels beside the agent's prebuild
    settings = CudaSettings(host_cache=tmp_path / "own", host_builtins=tmp_path / "builtins")
    assert settings.builtins_cache().own == tmp_path / "builtins"
    if os.geteuid() != 0:
        pytest.skip("handing the folder to another uid needs root")
    # An executor of a tenant's uid (here: the folder is another uid's) builds in its own
    (tmp_path / "builtins").mkdir()
    os.chown(tmp_path / "builtins", 54321, 54321)
    assert settings.builtins_cache().own == tmp_path / "own"
    assert settings.cache().find("missing.so") is None  # and does not trust it to load from
