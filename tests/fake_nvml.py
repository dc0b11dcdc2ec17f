"""pynvml at the NVML boundary, replaying GPU readings recorded on real H200s.

Only the calls hangd's NVML source makes are here; constants, error classes and structures are
pynvml's own, so every reply has the shape the real library gives: device handles are
``c_nvmlDevice_t`` pointers (a new pointer object per call, to the same device), a reading is the
ctypes structure NVML fills, an XID is the ``c_nvmlEventData_t`` that ``nvmlEventSetWait`` returns
(device, eventType ``nvmlEventTypeXidCriticalError``, eventData the XID), and an empty event set
raises ``NVMLError_Timeout``. A value the recording lacks is an NVML error, never a made-up zero.
"""

from __future__ import annotations

import ctypes
import json
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml

from hangd.analysis.engine import Analyzer
from hangd.replay import replay_result
from hangd.snapshot import GpuSample, Snapshot
from hangd.sources import nvml as nvml_source
from hangd.trace import TraceReader, TraceWriter

H200_NVLINKS = 18


def _addr(p: Any) -> int:
    return ctypes.cast(p, ctypes.c_void_p).value or 0


class FakeNvml:
    def __init__(self, gpus: list[dict[str, Any]], driver: str = "580.159.04") -> None:
        self._devs = [pynvml.struct_c_nvmlDevice_t() for _ in gpus]
        self._meta = gpus
        self.driver = driver
        self.readings: dict[int, GpuSample] = {}  # the recorded reading of each GPU at this tick
        self.extra_reasons: dict[int, int] = {}  # clock-event bits added to the recorded ones
        self.ecc: dict[int, tuple[int, int]] = {}  # index -> (corrected, uncorrected) volatile counts
        self.remapped: dict[int, tuple[int, int, int, int]] = {}  # index -> (corr, unc, pending, failure)
        self.fail: dict[str, int] = {}  # NVML function name -> the NVML error it returns
        self.lost: set[int] = set()  # GPUs that fell off the bus: every reading fails with GPU_IS_LOST
        self.calls: Counter[str] = Counter()
        self._events: deque[tuple[int, int]] = deque()
        self._registered: set[int] = set()
        self._gpm: dict[int, dict[str, float] | None] = {}

    def __getattr__(self, name: str) -> Any:  # constants, errors, structures: pynvml's own
        v = getattr(pynvml, name)
        if name.startswith("nvml") and callable(v) and not isinstance(v, type):
            raise AttributeError(f"the fake NVML does not answer {name}: add it to tests/fake_nvml.py")
        return v

    # ------------------------------------------------------------------ injecting

    def post_xid(self, index: int, code: int) -> None:
        """The driver posts an XID on a GPU (what ``nvidia-smi`` and dmesg's NVRM line also show)."""
        self._events.append((index, code))

    # ------------------------------------------------------------------ internals

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        if name in self.fail:
            raise pynvml.NVMLError(self.fail[name])

    def _index(self, handle: Any) -> int:
        a = _addr(handle)
        for i, d in enumerate(self._devs):
            if ctypes.addressof(d) == a:
                return i
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _read(self, name: str, handle: Any, field: str) -> Any:
        self._call(name)
        if self._index(handle) in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        g = self.readings.get(self._index(handle))
        v = getattr(g, field) if g is not None else None
        if v is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return v

    # ------------------------------------------------------------------ NVML

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlDeviceGetCount(self) -> int:
        return len(self._devs)

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return ctypes.pointer(self._devs[i])

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return str(self._meta[self._index(handle)]["uuid"])

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self._meta[self._index(handle)].get("name") or "NVIDIA H200")

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._read("nvmlDeviceGetUtilizationRates", handle, "util_gpu")
        mem = self.readings[self._index(handle)].util_mem or 0
        return pynvml.c_nvmlUtilization_t(gpu=gpu, memory=mem)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        used = self._read("nvmlDeviceGetMemoryInfo", handle, "mem_used")
        total = self.readings[self._index(handle)].mem_total or used
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._read("nvmlDeviceGetPowerUsage", handle, "power_mw"))

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        return int(self._read("nvmlDeviceGetClockInfo", handle, "sm_clock"))

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return int(self._read("nvmlDeviceGetTemperature", handle, "temp_c"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        v = self._read("nvmlDeviceGetCurrentClocksEventReasons", handle, "clock_event_reasons")
        return int(v) | self.extra_reasons.get(self._index(handle), 0)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return int(self._read("nvmlDeviceGetTotalEnergyConsumption", handle, "energy_mj"))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._call("nvmlDeviceGetComputeRunningProcesses")
        g = self.readings.get(self._index(handle))
        out = []
        for p in g.procs if g is not None else []:
            obj = pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_t(
                pid=p.pid, usedGpuMemory=p.used if p.used is not None else pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value,
                gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))
            if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    def nvmlDeviceGetProcessUtilization(self, handle: Any, since: int) -> list[Any]:
        self._call("nvmlDeviceGetProcessUtilization")
        g = self.readings.get(self._index(handle))
        rows = [x for x in (g.proc_util or []) if x.get("ts", 0) > since] if g is not None else []
        if not rows:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)  # no sample since ``since``
        return [pynvml.c_nvmlProcessUtilizationSample_t(pid=x["pid"], timeStamp=x["ts"], smUtil=x["sm"],
                                                         memUtil=x["mem"]) for x in rows]

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        return pynvml.c_nvmlGpmSupport_t(version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> Any:
        return ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> None:
        g = self.readings.get(self._index(handle))
        self._gpm[_addr(sample)] = g.gpm if g is not None else None

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._gpm.pop(_addr(sample), None)

    def nvmlGpmMetricsGet(self, mg: Any) -> None:
        # the recording holds the metrics between the tick before and this one: those of sample2
        values = self._gpm.get(_addr(mg.sample2)) or {}
        ids = {mid: key for key, mid in nvml_source._GPM_METRICS.items()}
        for i in range(mg.numMetrics):
            key = ids.get(mg.metrics[i].metricId)
            if key in values:
                mg.metrics[i].value, mg.metrics[i].nvmlReturn = values[key], pynvml.NVML_SUCCESS
            else:
                mg.metrics[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        self._call("nvmlDeviceGetTotalEccErrors")
        corr, unc = self.ecc.get(self._index(handle), (0, 0))
        return unc if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else corr

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        self._call("nvmlDeviceGetRemappedRows")
        return self.remapped.get(self._index(handle), (0, 0, 0, 0))

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._call("nvmlDeviceGetNvLinkState")
        if link >= H200_NVLINKS:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        self._call("nvmlDeviceGetNvLinkErrorCounter")
        return 0

    def nvmlEventSetCreate(self) -> Any:
        return ctypes.pointer(pynvml.struct_c_nvmlEventSet_t())

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: Any) -> None:
        self._call("nvmlDeviceRegisterEvents")
        self._registered.add(self._index(handle))

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        self._call("nvmlEventSetWait")
        while self._events:
            index, code = self._events.popleft()
            if index in self._registered:
                return pynvml.c_nvmlEventData_t(device=ctypes.pointer(self._devs[index]),
                                                eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=code,
                                                gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)


def install(monkeypatch: Any, fake: FakeNvml) -> None:
    """hangd's NVML source talks to ``fake`` (as it would to libnvidia-ml) for this test."""
    monkeypatch.setattr(nvml_source, "pynvml", fake)
    monkeypatch.setattr(nvml_source, "_initialised", False)


def through_nvml(trace: str | Path, fake: FakeNvml, src: nvml_source.NvmlSource,
                 before_tick: Any = None) -> Iterator[Snapshot]:
    """A recorded trace's snapshots, each one's GPU readings taken again by ``src`` from ``fake``
    serving that tick's recorded readings. ``before_tick(t, fake)`` injects events at time t."""
    for snap in TraceReader(trace).snapshots():
        if snap.gpus:
            fake.readings = {g.index: g for g in snap.gpus}
            if before_tick is not None:
                before_tick(snap.t, fake)
            src.clock = lambda t=snap.t: t
            fresh = Snapshot(t=snap.t)
            src.collect(fresh)
            snap.gpus = fresh.gpus
            snap.unavailable.update(fresh.unavailable)
        yield snap


def meta(trace: Path) -> dict[str, Any]:
    return dict(json.loads((trace / "meta.json").read_text()))


def analyze_through_nvml(monkeypatch: Any, trace: Path, inject: Any, record_to: Path | None = None,
                         **src_kw: Any) -> tuple[dict[str, Any], list[Snapshot], FakeNvml]:
    """A recorded trace analysed with its GPU readings taken again through hangd's NVML source
    from a FakeNvml serving them plus what ``inject`` adds; with ``record_to``, recorded again
    there (a trace of the same run, with what was injected). Returns the ``hangd replay --json``
    result, the snapshots and the fake."""
    fake = FakeNvml(meta(trace)["gpus"])
    install(monkeypatch, fake)
    an = Analyzer()
    snaps = []
    writer = TraceWriter(record_to, meta={"scenario": meta(trace).get("scenario")}) if record_to else None
    for snap in through_nvml(trace, fake, nvml_source.NvmlSource(**src_kw), inject):
        an.step(snap)
        an.take_requests()
        snaps.append(snap)
        if writer is not None:
            writer.write(snap)
    if writer is not None:
        writer.close()
    return replay_result(an), snaps, fake
