"""worker/node/gpus.py and worker/node/health.py against a recorded fake of the pynvml calls.

There is no GPU on the machines this project is built on, so NVML is never called here.
`FakeNvml` is a module-like object with pynvml's function, constant and error-class names
(`NVMLError_NotSupported`, `NVMLError_GpuIsLost`, `NVMLError_Timeout`, as nvidia-ml-py
names them); each device answers from a table of return values, where an exception
instance stands for NVML's error code. The H100 values follow the shapes pynvml returns
on an H100 SXM (name, UUID, 80 GiB memory info, 64-bit CPU affinity words, the
`(corrected, uncorrected, pending, failed)` remapped-rows tuple); they were written from
NVML's documentation, not captured from a card. The GPU tests (tests/gpu) hold the real
calls to the advert.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest

from vramfabric.broker.messages import GpuState, LeaseRequest
from vramfabric.worker.leases.ledger import SliceLedger
from vramfabric.worker.node.gpus import GpuSpec, discover_nvml
from vramfabric.worker.node.health import GpuReading, NvmlProbe

GiB = 2**30
DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol" / "messages.md"


class NVMLError(Exception):
    """pynvml's root error: `value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"nvml error {value}")
        self.value = value


# The error classes carry pynvml's own names, which ruff's naming rules would not pick.
class NVMLError_NotSupported(NVMLError):
    """NVML_ERROR_NOT_SUPPORTED (3)."""


class NVMLError_Timeout(NVMLError):
    """NVML_ERROR_TIMEOUT (10): no event waiting."""


class NVMLError_GpuIsLost(NVMLError):
    """NVML_ERROR_GPU_IS_LOST (15): the GPU fell off the bus."""


NOT_SUPPORTED = NVMLError_NotSupported(3)
H100_UUID = "GPU-5f2a7c1e-9b3d-4e8f-a1c6-2d7e9f0b3a41"


def h100(uuid: str = H100_UUID, **answers: Any) -> dict[str, Any]:
    """A healthy H100 SXM's answers, with `answers` replacing some."""
    table: dict[str, Any] = {
        "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": uuid,
        "nvmlDeviceGetMemoryInfo": SimpleNamespace(
            total=85_520_809_984, free=84_943_110_144, used=577_699_840
        ),
        "nvmlDeviceGetCpuAffinity": [(1 << 64) - 1],  # cores 0-63 local to this GPU
        "nvmlDeviceGetTotalEccErrors": 0,
        "nvmlDeviceGetRetiredPagesPendingStatus": NOT_SUPPORTED,  # Hopper remaps rows instead
        "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
        "nvmlDeviceGetTemperature": 34,
        "nvmlDeviceGetTemperatureThreshold": 87,  # slowdown
        "nvmlDeviceRegisterEvents": None,
    }
    table.update(answers)
    return table


@attrs.define
class FakeNvml:
    """The pynvml calls vramfabric makes, answered from per-device tables."""

    devices: list[dict[str, Any]]
    events: list[Any] = attrs.field(factory=list)
    calls: list[str] = attrs.field(factory=list)

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_TEMPERATURE_GPU = 0
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
    NVML_FEATURE_ENABLED = 1
    nvmlEventTypeXidCriticalError = 8

    def _answer(self, name: str, handle: int) -> Any:
        self.calls.append(name)
        value = self.devices[handle][name]
        if isinstance(value, BaseException):
            raise value
        return value

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvmlDevice"):
            raise AttributeError(name)
        return lambda handle, *_args: self._answer(name, handle)

    def nvmlInit(self) -> None:
        """Count one more user of NVML."""
        self.calls.append("nvmlInit")

    def nvmlShutdown(self) -> None:
        """Count one user fewer."""
        self.calls.append("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        """How many devices the table has."""
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        """A device's handle: its index here."""
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        """The handle of the device with that UUID."""
        return next(i for i, d in enumerate(self.devices) if d["nvmlDeviceGetUUID"] == uuid)

    def nvmlEventSetCreate(self) -> str:
        """An event set (one per fake)."""
        return "event-set"

    def nvmlEventSetWait_v2(self, _events: str, timeout_ms: int) -> Any:
        """The next queued event, or NVMLError_Timeout when none is."""
        assert timeout_ms == 0  # the heartbeat never blocks on events
        if not self.events:
            raise NVMLError_Timeout(10)
        return self.events.pop(0)

    def nvmlEventSetFree(self, _events: str) -> None:
        """Record that the event set was freed."""
        self.calls.append("nvmlEventSetFree")

    def xid(self, handle: int, xid: int) -> None:
        """Queue a critical XID event from a device, as the driver would."""
        self.events.append(SimpleNamespace(device=handle, eventData=xid, eventType=8))


def specs(nvml: FakeNvml) -> tuple[GpuSpec, ...]:
    return discover_nvml(nvml)


def probe_of(*devices: dict[str, Any]) -> tuple[FakeNvml, NvmlProbe]:
    nvml = FakeNvml(list(devices))
    return nvml, NvmlProbe(nvml, specs(nvml))


@pytest.fixture
def allowed() -> Iterator[set[int]]:
    """The CPUs this process may run on (NVML's answer is cut to them)."""
    yield os.sched_getaffinity(0)


def test_discovery_reads_name_uuid_memory_and_local_cpus(allowed: set[int]) -> None:
    # Given two H100s, the second local to no CPU this process may use, answered in bytes
    far = h100("GPU-2", nvmlDeviceGetName=b"NVIDIA H100 80GB HBM3", nvmlDeviceGetCpuAffinity=[0])
    gpus = specs(FakeNvml([h100(), far]))
    # Then both are real GPUs with NVML's facts
    assert [(g.index, g.model, g.uuid, g.simulated) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", H100_UUID, False),
        (1, "NVIDIA H100 80GB HBM3", "GPU-2", False),
    ]
    assert gpus[0].total_bytes == 85_520_809_984
    # And the first's local CPUs are NVML's mask within this process's set
    assert gpus[0].cpus == tuple(sorted(c for c in allowed if c < 64))
    assert gpus[1].cpus == ()


def test_discovery_without_cpu_affinity_leaves_executors_unpinned() -> None:
    gpus = specs(FakeNvml([h100(nvmlDeviceGetCpuAffinity=NOT_SUPPORTED)]))
    assert gpus[0].cpus == ()


def test_a_healthy_h100_reads_free_memory_and_temperature() -> None:
    _, probe = probe_of(h100())
    assert probe.read() == (GpuReading(0, free_bytes=84_943_110_144, temperature_c=34),)


def test_checks_a_board_does_not_support_are_skipped_not_problems() -> None:
    # Given a board that supports nothing but memory info
    unsupported: dict[str, Any] = {
        name: NOT_SUPPORTED
        for name in h100()
        if name not in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo")
    }
    _, probe = probe_of(h100(**unsupported))
    # Then it is healthy, with no temperature
    assert probe.read() == (GpuReading(0, free_bytes=84_943_110_144),)


@pytest.mark.parametrize(
    ("answers", "problem"),
    [
        ({"nvmlDeviceGetTotalEccErrors": 2}, "2 uncorrected ECC errors"),
        ({"nvmlDeviceGetRetiredPagesPendingStatus": 1}, "retired pages pending a reset"),
        ({"nvmlDeviceGetRemappedRows": (0, 1, 1, 0)}, "remapped rows pending a reset"),
        ({"nvmlDeviceGetRemappedRows": (0, 1, 0, 1)}, "row remapping failed"),
        ({"nvmlDeviceGetTemperature": 88}, "temperature 88 C at or above its slowdown 87 C"),
        (
            {"nvmlDeviceGetTotalEccErrors": 1, "nvmlDeviceGetTemperature": 90},
            "1 uncorrected ECC errors; temperature 90 C at or above its slowdown 87 C",
        ),
    ],
)
def test_hardware_problems_make_a_gpu_unhealthy(answers: dict[str, Any], problem: str) -> None:
    _, probe = probe_of(h100(**answers))
    assert probe.read()[0].problem == problem


def test_rows_remapped_after_a_reset_are_healthy() -> None:
    # An uncorrectable error whose row was remapped at the last reset: nothing pending
    _, probe = probe_of(h100(nvmlDeviceGetRemappedRows=(2, 1, 0, 0)))
    assert probe.read()[0].problem == ""


def test_a_critical_xid_marks_its_gpu_until_restart_and_application_xids_do_not() -> None:
    # Given two GPUs
    nvml, probe = probe_of(h100(), h100("GPU-2"))
    # When GPU 1 reports XID 79 (fallen off the bus) and GPU 0 XID 13 (a kernel's fault)
    nvml.xid(1, 79)
    nvml.xid(0, 13)
    first = probe.read()
    # Then only GPU 1 is unhealthy, and it stays so with no further events
    assert [r.problem for r in first] == ["", "xid 79"]
    assert [r.problem for r in probe.read()] == ["", "xid 79"]


def test_a_lost_gpu_is_unhealthy() -> None:
    # Given a GPU that falls off the bus after discovery
    nvml, probe = probe_of(h100())
    nvml.devices[0]["nvmlDeviceGetMemoryInfo"] = NVMLError_GpuIsLost(15)
    # Then its next reading says so and nothing else
    assert probe.read() == (GpuReading(0, problem="gpu is lost (fell off the bus)"),)


def test_xid_events_not_supported_leave_the_other_checks() -> None:
    _, probe = probe_of(h100(nvmlDeviceRegisterEvents=NOT_SUPPORTED))
    assert probe.read()[0].problem == ""


def test_close_frees_the_event_set_and_releases_nvml() -> None:
    nvml, probe = probe_of(h100())
    probe.close()
    assert nvml.calls[-2:] == ["nvmlEventSetFree", "nvmlShutdown"]


def test_simulated_gpus_get_no_probe() -> None:
    assert NvmlProbe.open((GpuSpec(0, "simulated", GiB),)) is None


def test_an_unhealthy_gpu_gets_no_lease() -> None:
    # Given a node of two H100s whose second has an uncorrected ECC error
    nvml, probe = probe_of(h100(), h100("GPU-2", nvmlDeviceGetTotalEccErrors=3))
    ledger = SliceLedger("n1", specs(nvml), GiB)
    ledger.observe(probe.read())
    # When a job asks for more leases than one GPU holds
    grant = ledger.grant(LeaseRequest("r1", "j1", 200, GiB, 30.0), "acme", 0.0)
    # Then every lease is on GPU 0, as many as NVML says fit there
    assert {lease.gpu for lease in grant.leases} == {0}
    assert len(grant.leases) == 84_943_110_144 // GiB
    # And the advert says why GPU 1 takes none
    sick = ledger.advert(0.0).gpus[1]
    assert (sick.healthy, sick.problem) == (False, "3 uncorrected ECC errors")


def test_protocol_doc_describes_every_gpu_state_field() -> None:
    section = DOC.read_text().split("### `GpuState`", 1)[1].split("\n### ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE))
    assert documented == {f.name for f in attrs.fields(GpuState)}
