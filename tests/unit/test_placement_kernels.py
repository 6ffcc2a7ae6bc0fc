"""Placement that knows kernels: adverts list them, runs_on filters by them, refusal says so."""

from __future__ import annotations

import msgpack
import pytest

from tests.kernels_one_node import ONLY_HERE
from vramfabric.broker.codec import decode, encode
from vramfabric.broker.errors import CodeRefused, KernelNotFound
from vramfabric.broker.messages import GpuState, JobSpec, NodeAdvert
from vramfabric.coordinator.jobs.work import job_work
from vramfabric.coordinator.leases.placement import lists_kernel, plan, refusal
from vramfabric.kernels import builtin_registry
from vramfabric.kernels.registry import BUILTIN_NAMES, kernel_names
from vramfabric.worker.adverts import node_facts
from vramfabric.worker.node.settings import WorkerSettings

S = 2**30


def advert(
    node: str,
    kernels: tuple[str, ...] | None,
    model: str = "simulated",
    allow_code: bool = False,
    python: str = "3.11",
) -> NodeAdvert:
    """A node of one GPU with 4 free slices of S, listing `kernels` (None: an older worker)."""
    gpu = GpuState(
        index=0, model=model, total_bytes=4 * S, free_bytes=4 * S, leased_bytes=0, slice_bytes=S
    )
    return NodeAdvert(
        node=node,
        gpus=(gpu,),
        tenants={},
        sent_at=0.0,
        python=python,
        allow_code=allow_code,
        kernels=kernels,
    )


def spec_of(kind: str, kernel: str = "only_here") -> JobSpec:
    """A job of `kernel`, of work kind `kind`."""
    return JobSpec(tenant="t", kernel=kernel, kernel_digest="d" * 64, n_chunks=4, kernel_kind=kind)


def test_builtin_names_are_the_builtin_registrys() -> None:
    # The agent advertises BUILTIN_NAMES without importing the built-ins: they must agree
    assert sorted(BUILTIN_NAMES) == sorted(builtin_registry())


def test_a_node_advertises_its_modules_kernels_beside_the_builtins() -> None:
    # Given a worker given one kernel module, and one given none
    given = WorkerSettings(node="a", kernel_modules=("tests.kernels_one_node",))
    plain = WorkerSettings(node="b")
    # Then their adverts list the built-ins, and the module's kernels where it was given
    assert node_facts(given, "shared-uid")["kernels"] == ("hyperparam_eval", "only_here")
    assert node_facts(plain, "shared-uid")["kernels"] == ("hyperparam_eval",)


def test_a_module_without_kernels_fails_the_kernel_list() -> None:
    with pytest.raises(ValueError, match="has no KERNELS"):
        kernel_names(["tests.helpers"])


def test_a_registered_kernel_is_planned_only_on_nodes_that_list_it() -> None:
    # Given two nodes of 4 free slices, only one listing the job's kernel
    fleet = [advert("has", ("hyperparam_eval", "only_here")), advert("lacks", ("hyperparam_eval",))]
    work = job_work(ONLY_HERE)
    # When a pool filters the fleet by the work (as LeasePool does) and plans 8 leases
    eligible = [a for a in fleet if work.runs_on(a)]
    # Then only the listing node is asked, for what it has
    assert [a.node for a in eligible] == ["has"]
    assert plan(eligible, S, 8) == [("has", 4)]
    assert plan(eligible, S, 8, "pack") == [("has", 4)]


def test_an_advert_without_a_kernel_list_counts_as_running_any() -> None:
    # Given a node of an older version, which lists no kernels
    old = advert("old", None)
    # Then it may run any registered kernel (as before), and it is no refusal
    assert lists_kernel(old, "only_here")
    assert job_work(ONLY_HERE).runs_on(old)
    fleet = [old, advert("new", ())]
    assert refusal(spec_of("builtin"), fleet, job_work(ONLY_HERE).runs_on) is None


def test_an_advert_of_an_older_version_decodes_without_a_kernel_list() -> None:
    # Given an advert as a worker of an older version sends it: no `kernels` field
    body = msgpack.unpackb(encode(advert("old", ("x",))), raw=False)
    del body["kernels"]
    # When it is decoded, Then its kernel list is unknown (None), not empty
    assert decode(NodeAdvert, msgpack.packb(body, use_bin_type=True)).kernels is None


def test_a_kernel_no_live_node_lists_is_refused_naming_it_and_the_fleet() -> None:
    # Given two nodes listing the built-in and one a test kernel, none the job's
    fleet = [advert("a", ("hyperparam_eval", "sleepy")), advert("b", ("hyperparam_eval",))]
    # When a job of `only_here` is about to lease
    refused = refusal(spec_of("builtin"), fleet, job_work(ONLY_HERE).runs_on)
    # Then it is refused before leasing: the kernel, what the fleet has, and the cure
    assert isinstance(refused, KernelNotFound)
    assert refused.name == "only_here"
    assert str(refused) == (
        "unknown kernel 'only_here': no live node has it; the 2 live nodes have "
        "hyperparam_eval (2), sleepy (1) (start a worker with --kernel-module naming the "
        "module whose KERNELS registers it)"
    )


def test_a_kernel_a_live_node_lists_is_not_refused() -> None:
    fleet = [advert("a", ("hyperparam_eval",)), advert("b", ("only_here",))]
    assert refusal(spec_of("builtin"), fleet, job_work(ONLY_HERE).runs_on) is None


def test_an_empty_fleet_is_no_refusal() -> None:
    # The run waits for nodes to join, as it always did
    assert refusal(spec_of("builtin"), [], job_work(ONLY_HERE).runs_on) is None


def test_a_long_fleet_kernel_list_is_cut() -> None:
    fleet = [advert("a", tuple(f"k{i:02}" for i in range(25)))]
    refused = refusal(spec_of("builtin"), fleet, job_work(ONLY_HERE).runs_on)
    assert "k19 (1) and 5 more" in str(refused)
    assert "k20" not in str(refused)


def test_a_cuda_kernel_no_node_may_run_is_refused_as_code() -> None:
    # Given simulated nodes that run no users' code (a CUDA kernel there is native code)
    fleet = [advert("a", ("hyperparam_eval",)), advert("b", None)]

    def runs(a: NodeAdvert) -> bool:
        return not a.simulated or a.allow_code  # JobWork.runs_on of a CUDA kernel

    # When a CUDA kernel's job is about to lease
    refused = refusal(spec_of("cuda", "saxpy"), fleet, runs)
    # Then it is refused as code, saying what the fleet runs
    assert isinstance(refused, CodeRefused)
    assert str(refused) == (
        "no live node runs CUDA kernel 'saxpy'; the 2 live nodes: none runs code "
        "(--allow-code); 2 with simulated GPUs"
    )


def test_a_function_refusal_counts_the_pythons_of_the_nodes_that_run_code() -> None:
    fleet = [advert("a", None, allow_code=True, python="3.12"), advert("b", None, model="H100")]
    refused = refusal(spec_of("python", "f"), fleet, lambda _a: False)
    assert str(refused) == (
        "no live node runs Python functions; the 2 live nodes: Python 3.12 (1) run code "
        "(--allow-code); 1 with simulated GPUs"
    )
