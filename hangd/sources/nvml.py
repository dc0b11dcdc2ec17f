"""NVML: the only module that imports pynvml.

Initialises once under a lock; an NVML function a GPU does not support is logged once and not
called again; a missing driver makes the source unavailable with a HINT and hangd runs on /proc.

Costs measured on H200 (per call, per GPU): utilization/memory/power/clocks < 0.05 ms, compute
processes 0.44 ms, process utilization 1.5 ms, GPM sample + 10 metrics 0.3 ms, total energy
2.8 ms (p99 13.8 ms, so read every ``energy_every`` ticks). ``nvmlDeviceGetPcieThroughput`` waits a
20 ms window per call and is never used here: GPM gives PCIe rates.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from hangd.snapshot import GpuProc, GpuSample, Snapshot
from hangd.sources.base import Unavailable

log = logging.getLogger("hangd.sources.nvml")

try:  # nvidia-ml-py; absent in a stripped install is unusual but not fatal
    import pynvml
except ImportError:  # pragma: no cover - dependency of hangd
    pynvml = None

DRIVER_HINT = (
    "HINT: on a GPU host install the NVIDIA driver; in a container mount /dev/nvidia* and the driver "
    "libraries (NVIDIA container toolkit: --gpus all, or the nvidia runtime class on Kubernetes)"
)

# trace name -> NVML GPM metric id (percentages, or MiB/s for the rates)
_GPM_METRICS = {
    "SM_UTIL": 2,
    "SM_OCCUPANCY": 3,
    "ANY_TENSOR_UTIL": 5,
    "DRAM_BW_UTIL": 10,
    "FP32_UTIL": 12,
    "FP16_UTIL": 13,
    "PCIE_TX_PER_SEC": 20,
    "PCIE_RX_PER_SEC": 21,
    "NVLINK_TOTAL_RX_PER_SEC": 60,
    "NVLINK_TOTAL_TX_PER_SEC": 61,
}

# NVML's init errors in an operator's words (pynvml's own say "NVML Shared Library Not Found")
_INIT_WHY = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 (the driver's NVML library) cannot be found or loaded",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded",
    "NVML_ERROR_NO_PERMISSION": "no permission to open the GPU devices (/dev/nvidia*)",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "the NVML library and the kernel driver have different versions",
}
_INIT_HINT = {
    "NVML_ERROR_NO_PERMISSION": "HINT: run hangd as root, or give its user access to /dev/nvidia*",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "HINT: the driver was upgraded without a reboot: reboot, or reload the "
                                          "nvidia kernel modules",
}


def _init_error(e: Exception) -> Unavailable:
    """An NVML init failure as an Unavailable whose words say what is wrong and what to do."""
    code = getattr(e, "value", None)
    name = next((n for n in _INIT_WHY if getattr(pynvml, n, object()) == code), None)
    why = f"NVML cannot start: {_INIT_WHY[name]} ({e})" if name else f"NVML cannot start: {e}"
    return Unavailable(why, _INIT_HINT.get(name or "", DRIVER_HINT))


_lock = threading.Lock()
_initialised = False


def _init() -> None:
    global _initialised
    with _lock:
        if _initialised:
            return
        if pynvml is None:
            raise Unavailable("nvidia-ml-py is not installed", "HINT: pip install nvidia-ml-py")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise _init_error(e) from e
        except OSError as e:
            raise Unavailable(f"NVML cannot start: libnvidia-ml.so.1 cannot be loaded: {e}", DRIVER_HINT) from e
        _initialised = True


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class _Gpu:
    def __init__(self, index: int) -> None:
        self.index = index
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.uuid = _s(pynvml.nvmlDeviceGetUUID(self.handle))
        self.name = _s(pynvml.nvmlDeviceGetName(self.handle))
        self.unsupported: set[str] = set()
        self.gpm_prev: Any = None
        self.gpm_ok = False
        self.last_proc_ts = 0
        self.energy_mj: int | None = None
        try:
            self.gpm_ok = bool(pynvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice)
        except Exception:
            self.gpm_ok = False


class NvmlSource:
    """One GpuSample per GPU per tick."""

    name = "nvml"

    def __init__(self, energy_every: int = 10, proc_util: bool = True) -> None:
        self.energy_every = max(1, energy_every)
        self.proc_util = proc_util
        self._gpus: list[_Gpu] | None = None
        self._tick = 0
        self._events: Any = None
        self._events_ok = True
        self.driver: str | None = None

    def gpus(self) -> list[_Gpu]:
        if self._gpus is None:
            _init()
            try:
                n = pynvml.nvmlDeviceGetCount()
                self.driver = _s(pynvml.nvmlSystemGetDriverVersion())
            except pynvml.NVMLError as e:
                raise Unavailable(f"NVML device count failed: {e}", DRIVER_HINT) from e
            if n == 0:
                raise Unavailable("no NVIDIA GPU on this host", "HINT: hangd still watches /proc")
            self._gpus = [_Gpu(i) for i in range(n)]
        return self._gpus

    def _call(self, gpu: _Gpu, name: str, fn: Any, *args: Any) -> Any:
        """Call an NVML getter; unsupported ones are logged once and skipped after that."""
        if name in gpu.unsupported:
            return None
        try:
            return fn(gpu.handle, *args)
        except pynvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                        pynvml.NVML_ERROR_NO_PERMISSION):
                gpu.unsupported.add(name)
                log.info("GPU %d: %s not available (%s); not asking again", gpu.index, name, e)
            elif code == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise
            return None

    def _gpm(self, gpu: _Gpu) -> dict[str, float] | None:
        if not gpu.gpm_ok:
            return None
        try:
            cur = pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmSampleGet(gpu.handle, cur)
        except pynvml.NVMLError as e:
            gpu.gpm_ok = False
            log.info("GPU %d: GPM unavailable (%s)", gpu.index, e)
            return None
        prev, gpu.gpm_prev = gpu.gpm_prev, cur
        if prev is None:
            return None
        try:
            mg = pynvml.c_nvmlGpmMetricsGet_t()
            mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(_GPM_METRICS)
            mg.sample1, mg.sample2 = prev, cur
            for i, mid in enumerate(_GPM_METRICS.values()):
                mg.metrics[i].metricId = mid
            pynvml.nvmlGpmMetricsGet(mg)
            out = {}
            for i, key in enumerate(_GPM_METRICS):
                if mg.metrics[i].nvmlReturn == 0:
                    out[key] = round(float(mg.metrics[i].value), 3)
            return out or None
        except pynvml.NVMLError as e:
            log.debug("GPU %d: GPM metrics failed (%s)", gpu.index, e)
            return None
        finally:
            try:
                pynvml.nvmlGpmSampleFree(prev)
            except pynvml.NVMLError:
                pass

    def _sample(self, gpu: _Gpu) -> GpuSample:
        s = GpuSample(index=gpu.index, uuid=gpu.uuid, name=gpu.name)
        u = self._call(gpu, "utilization", pynvml.nvmlDeviceGetUtilizationRates)
        if u is not None:
            s.util_gpu, s.util_mem = int(u.gpu), int(u.memory)
        m = self._call(gpu, "memory", pynvml.nvmlDeviceGetMemoryInfo)
        if m is not None:
            s.mem_used, s.mem_total = int(m.used), int(m.total)
        s.power_mw = self._call(gpu, "power", pynvml.nvmlDeviceGetPowerUsage)
        s.sm_clock = self._call(gpu, "sm_clock", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM)
        s.temp_c = self._call(gpu, "temperature", pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU)
        reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        s.clock_event_reasons = self._call(gpu, "clock_event_reasons", reasons_fn)
        if self._tick % self.energy_every == 0:
            gpu.energy_mj = self._call(gpu, "energy", pynvml.nvmlDeviceGetTotalEnergyConsumption)
        s.energy_mj = gpu.energy_mj
        procs = self._call(gpu, "compute_processes", pynvml.nvmlDeviceGetComputeRunningProcesses) or []
        s.procs = [GpuProc(pid=int(p.pid), used=int(p.usedGpuMemory) if p.usedGpuMemory is not None else None) for p in procs]
        if self.proc_util and s.procs:
            samples = self._call(gpu, "process_utilization", pynvml.nvmlDeviceGetProcessUtilization, gpu.last_proc_ts)
            if samples:
                s.proc_util = [{"pid": int(x.pid), "sm": int(x.smUtil), "mem": int(x.memUtil), "ts": int(x.timeStamp)} for x in samples]
                gpu.last_proc_ts = max(int(x.timeStamp) for x in samples)
        s.gpm = self._gpm(gpu)
        return s

    def _xid_events(self) -> list[dict[str, Any]]:
        """Critical XID events, without blocking (wait 0 ms)."""
        if not self._events_ok or self._gpus is None:
            return []
        try:
            if self._events is None:
                self._events = pynvml.nvmlEventSetCreate()
                for g in self._gpus:
                    pynvml.nvmlDeviceRegisterEvents(g.handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
            out = []
            for _ in range(16):
                try:
                    ev = pynvml.nvmlEventSetWait(self._events, 0)
                except pynvml.NVMLError_Timeout:
                    break
                out.append({"xid": int(ev.eventData), "t": time.time(), "gpu_uuid": None})
            return out
        except pynvml.NVMLError as e:
            self._events_ok = False
            log.info("XID events unavailable (%s)", e)
            return []

    def collect(self, snap: Snapshot) -> None:
        gpus = self.gpus()
        self._tick += 1
        for gpu in gpus:
            try:
                snap.gpus.append(self._sample(gpu))
            except pynvml.NVMLError as e:  # GPU lost mid-run: report it, keep the others
                snap.unavailable[f"nvml:{gpu.index}"] = f"unavailable: GPU {gpu.index}: {e}"
        xids = self._xid_events()
        if xids and snap.gpus:
            snap.gpus[0].xid = xids
