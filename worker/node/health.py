"""GPU health through NVML: free memory, ECC, retired pages or remapped rows, XIDs, heat.

Read on every heartbeat, off the event loop (a failing GPU can make NVML calls slow). A
GPU with a problem stops taking leases and drains (`SliceLedger.observe`); the problem is
named in its advert. A check NVML does not support on a board is skipped, not a problem.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import attrs

from .gpus import GpuSpec, open_nvml, text

log = logging.getLogger(__name__)

# XIDs that NVML reports as critical but that an application's own fault causes (a page
# fault, an engine exception, a preempted context): the GPU stays healthy. The same list as
# NVIDIA's Kubernetes device plugin; every other critical XID marks the GPU unhealthy.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@attrs.frozen
class GpuReading:
    """One GPU as NVML saw it at one heartbeat."""

    index: int
    # NVML's free memory (None: it could not say); the node advertises at most this.
    free_bytes: int | None = None
    temperature_c: int | None = None
    # Why the GPU is unhealthy; empty when it is healthy.
    problem: str = ""


@attrs.define
class NvmlProbe:
    """Reads the node's real GPUs through an initialised pynvml(-like) module."""

    nvml: Any
    gpus: tuple[GpuSpec, ...]
    _handles: dict[int, Any] = attrs.field(factory=dict, init=False)
    _by_uuid: dict[str, int] = attrs.field(factory=dict, init=False)
    _events: Any = attrs.field(default=None, init=False)
    # Critical XIDs seen per GPU: sticky until the agent restarts (a reset clears them).
    _xids: dict[int, set[int]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        for gpu in self.gpus:
            self._handles[gpu.index] = self.nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            self._by_uuid[gpu.uuid] = gpu.index
        self._events = self._register_xids()

    @classmethod
    def open(cls, gpus: tuple[GpuSpec, ...]) -> NvmlProbe | None:
        """A probe over the real GPUs among `gpus`, or None (simulated, or no NVML)."""
        real = tuple(g for g in gpus if not g.simulated)
        if not real:
            return None
        nvml = open_nvml()
        return None if nvml is None else cls(nvml, real)

    def close(self) -> None:
        """Free the XID event set and release NVML."""
        if self._events is not None:
            self.nvml.nvmlEventSetFree(self._events)
            self._events = None
        self.nvml.nvmlShutdown()

    def read(self) -> tuple[GpuReading, ...]:
        """Every GPU's free memory, temperature and problems now (blocking NVML calls)."""
        self._drain_xids()
        return tuple(self._read(gpu.index) for gpu in self.gpus)

    def _read(self, index: int) -> GpuReading:
        handle = self._handles[index]
        nv = self.nvml
        problems = [f"xid {x}" for x in sorted(self._xids.get(index, ()))]
        try:
            free = self._ask(lambda: int(nv.nvmlDeviceGetMemoryInfo(handle).free))
            temp = self._ask(
                lambda: int(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))
            )
            problems += self._memory_problems(handle)
            problems += self._heat_problems(handle, temp)
        except nv.NVMLError_GpuIsLost:
            return GpuReading(index, problem="gpu is lost (fell off the bus)")
        return GpuReading(index, free, temp, "; ".join(problems))

    def _memory_problems(self, handle: Any) -> list[str]:
        nv, out = self.nvml, []
        # Uncorrected ECC errors since the driver loaded (volatile counter).
        uncorrected = self._ask(
            lambda: nv.nvmlDeviceGetTotalEccErrors(
                handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            )
        )
        if uncorrected:
            out.append(f"{uncorrected} uncorrected ECC errors")
        # Pre-Ampere boards retire pages; they take effect only after a reset.
        pending = self._ask(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        if pending == nv.NVML_FEATURE_ENABLED:
            out.append("retired pages pending a reset")
        # Ampere and later remap rows instead: (corrected, uncorrected, pending, failed).
        rows = self._ask(lambda: nv.nvmlDeviceGetRemappedRows(handle))
        if rows is not None and rows[3]:
            out.append("row remapping failed")
        elif rows is not None and rows[2]:
            out.append("remapped rows pending a reset")
        return out

    def _heat_problems(self, handle: Any, temp_c: int | None) -> list[str]:
        nv = self.nvml
        slowdown_c = self._ask(
            lambda: int(
                nv.nvmlDeviceGetTemperatureThreshold(handle, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
            )
        )
        if temp_c is not None and slowdown_c and temp_c >= slowdown_c:
            return [f"temperature {temp_c} C at or above its slowdown {slowdown_c} C"]
        return []

    def _ask(self, call: Callable[[], Any]) -> Any:
        """The call's answer, or None where NVML cannot say; a lost GPU propagates."""
        nv = self.nvml
        try:
            return call()
        except nv.NVMLError_GpuIsLost:
            raise
        except nv.NVMLError as exc:  # NotSupported above all: the check does not apply
            log.debug("nvml query skipped error=%s", exc)
            return None

    def _register_xids(self) -> Any:
        nv = self.nvml
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.info("no xid events from nvml error=%s", exc)
            return None
        for index, handle in self._handles.items():
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
            except nv.NVMLError as exc:  # NotSupported on some boards and in containers
                log.info("no xid events from nvml gpu=%d error=%s", index, exc)
        return events

    def _drain_xids(self) -> None:
        """Take every XID event waiting now (a zero timeout: never blocks the beat)."""
        nv = self.nvml
        while self._events is not None:
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError_Timeout:
                return
            except nv.NVMLError as exc:
                log.warning("xid events unreadable error=%s", exc)
                return
            xid = int(data.eventData)
            try:
                index = self._by_uuid.get(text(nv.nvmlDeviceGetUUID(data.device)))
            except nv.NVMLError:
                index = None
            if index is None or xid in APPLICATION_XIDS:
                # A lost GPU's own reads fail next and mark it; an application's fault does not.
                log.info("xid event gpu=%s xid=%d: not a hardware fault of a known gpu", index, xid)
                continue
            log.error("critical xid gpu=%d xid=%d: gpu drains", index, xid)
            self._xids.setdefault(index, set()).add(xid)
