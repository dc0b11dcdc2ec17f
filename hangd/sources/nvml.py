"""NVML: the only module that imports pynvml.

Initialises once under a lock; an NVML function a GPU does not support is logged once and not
called again; a missing driver makes the source unavailable with a HINT and hangd runs on /proc.

Costs measured on H200 (per call, per GPU): utilization/memory/power/clocks < 0.05 ms, compute
processes 0.44 ms, process utilization 1.5 ms, GPM sample + 10 metrics 0.3 ms, total energy
2.8 ms (p99 13.8 ms, so read every ``energy_every`` ticks). ``nvmlDeviceGetPcieThroughput`` waits a
20 ms window per call and is never used here: GPM gives PCIe rates.

Hardware health: XID errors arrive as NVML events (read without waiting, every tick) and go on the
reading of the GPU that raised them, stamped with the time hangd read them (NVML's event data has no
time). Clock-event (throttle) reasons are read every tick and decoded here, with pynvml's
constants. ECC error counts, remapped rows and NVLink error counters change rarely and are read
every ``health_every`` ticks, the last value carried between reads; a call that fails is logged
once and its value is unknown (None), never 0. Measured on H200 (driver 580): ECC counts, remapped
rows and clock-event reasons < 0.003 ms a call, a wait-0 event read 0.02 ms; on a GPU without
NVLink every link answers NOT_SUPPORTED (0.34 ms for all 36, once) and NVLink is not read again.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
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

# pynvml's clock-event reason bits -> the names hangd/analysis/hardware.toml gives them (pynvml before
# 12 calls them nvmlClocksThrottleReason*)
_CLOCK_EVENTS = {
    "GpuIdle": "gpu_idle",
    "ApplicationsClocksSetting": "applications_clocks_setting",
    "SwPowerCap": "sw_power_cap",
    "HwSlowdown": "hw_slowdown",
    "SyncBoost": "sync_boost",
    "SwThermalSlowdown": "sw_thermal_slowdown",
    "HwThermalSlowdown": "hw_thermal_slowdown",
    "HwPowerBrakeSlowdown": "hw_power_brake_slowdown",
    "DisplayClockSetting": "display_clock_setting",
}
# NVLink error counters summed over a GPU's active links
_NVLINK_COUNTERS = {
    "replay": "NVML_NVLINK_ERROR_DL_REPLAY",
    "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
    "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
}


def clock_events(reasons: int | None) -> list[str] | None:
    """NVML's clock-event reasons bitmask as names; None when it could not be read."""
    if reasons is None:
        return None
    out = []
    for bit, name in _CLOCK_EVENTS.items():
        mask = getattr(pynvml, "nvmlClocksEventReason" + bit, None)
        if mask is None:
            mask = getattr(pynvml, "nvmlClocksThrottleReason" + bit, 0)
        if mask and reasons & mask:
            out.append(name)
    return out


def _handle_key(handle: Any) -> Any:
    """A device handle's identity: NVML hands out a new pointer object per call, to the same device."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


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
        self.failed: set[str] = set()  # calls whose failure was logged (once each)
        # the low-rate readings, carried between reads (None: unknown)
        self.health: dict[str, Any] = {}
        self.nvlinks: list[int] | None = None  # its active links, found on the first read
        try:
            self.gpm_ok = bool(pynvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice)
        except Exception:
            self.gpm_ok = False


class NvmlSource:
    """One GpuSample per GPU per tick."""

    name = "nvml"

    def __init__(self, energy_every: int = 10, proc_util: bool = True, health_every: int = 20,
                 clock: Callable[[], float] = time.time) -> None:
        self.energy_every = max(1, energy_every)
        self.health_every = max(1, health_every)
        self.clock = clock
        self.proc_util = proc_util
        self._gpus: list[_Gpu] | None = None
        self._tick = 0
        self._events: Any = None
        self._events_ok = True
        self._by_handle: dict[Any, _Gpu] = {}
        self._unmatched_logged = False
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
            elif code != pynvml.NVML_ERROR_NOT_FOUND and name not in gpu.failed:  # not found: no new sample
                gpu.failed.add(name)
                log.info("GPU %d: %s failed (%s); its value is unknown while it fails", gpu.index, name, e)
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
        s.clock_events = clock_events(s.clock_event_reasons)
        if (self._tick - 1) % self.health_every == 0:
            self._read_health(gpu)
        for k, v in gpu.health.items():
            setattr(s, k, v)
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

    def _read_health(self, gpu: _Gpu) -> None:
        """ECC error counts, remapped rows, NVLink errors: read at a low rate; unknown when they fail."""
        h = gpu.health
        h["ecc_uncorrected"] = self._call(gpu, "ecc_uncorrected", pynvml.nvmlDeviceGetTotalEccErrors,
                                          pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        h["ecc_corrected"] = self._call(gpu, "ecc_corrected", pynvml.nvmlDeviceGetTotalEccErrors,
                                        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)
        rows = self._call(gpu, "remapped_rows", pynvml.nvmlDeviceGetRemappedRows)
        h["remap_pending"] = bool(rows[2]) if rows is not None else None
        h["remap_failure"] = bool(rows[3]) if rows is not None else None
        h["nvlink_errors"] = self._nvlink_errors(gpu)

    def _nvlink_errors(self, gpu: _Gpu) -> dict[str, int] | None:
        if "nvlink_errors" in gpu.unsupported:
            return None
        if gpu.nvlinks is None:
            gpu.nvlinks = []
            for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(gpu.handle, link) == pynvml.NVML_FEATURE_ENABLED:
                        gpu.nvlinks.append(link)
                except pynvml.NVMLError as e:
                    if getattr(e, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
                        gpu.nvlinks = None
                        raise
                    continue  # a link this GPU does not have
            if not gpu.nvlinks:
                gpu.unsupported.add("nvlink_errors")
                log.info("GPU %d: no active NVLink; NVLink errors not read", gpu.index)
                return None
        out = {}
        for name, const in _NVLINK_COUNTERS.items():
            total = 0
            for link in gpu.nvlinks:
                v = self._call(gpu, "nvlink_errors", pynvml.nvmlDeviceGetNvLinkErrorCounter, link, getattr(pynvml, const))
                if v is None:
                    return None
                total += int(v)
            out[name] = total
        return out

    def _xid_events(self) -> list[tuple[_Gpu, dict[str, Any]]]:
        """Critical XID events, without blocking (wait 0 ms), each with the GPU that raised it."""
        if not self._events_ok or self._gpus is None:
            return []
        try:
            if self._events is None:
                self._events = pynvml.nvmlEventSetCreate()
                for g in self._gpus:
                    try:
                        pynvml.nvmlDeviceRegisterEvents(g.handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
                        self._by_handle[_handle_key(g.handle)] = g
                    except pynvml.NVMLError as e:
                        log.info("GPU %d: XID events unavailable (%s)", g.index, e)
                if not self._by_handle:
                    self._events_ok = False
                    return []
            out = []
            for _ in range(16):
                try:
                    ev = pynvml.nvmlEventSetWait(self._events, 0)
                except pynvml.NVMLError_Timeout:
                    break
                if not int(ev.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                    continue
                gpu = self._event_gpu(ev.device)
                if gpu is None:
                    if not self._unmatched_logged:
                        self._unmatched_logged = True
                        log.warning("XID %d from a GPU hangd does not know; left out", int(ev.eventData))
                    continue
                out.append((gpu, {"xid": int(ev.eventData), "t": round(self.clock(), 3)}))
            return out
        except pynvml.NVMLError as e:
            self._events_ok = False
            log.info("XID events unavailable (%s)", e)
            return []

    def _event_gpu(self, handle: Any) -> _Gpu | None:
        gpu = self._by_handle.get(_handle_key(handle))
        if gpu is None and self._gpus:
            try:  # a handle that does not compare equal: its uuid does
                uuid = _s(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError:
                return None
            gpu = next((g for g in self._gpus if g.uuid == uuid), None)
        return gpu

    def collect(self, snap: Snapshot) -> None:
        gpus = self.gpus()
        self._tick += 1
        for gpu in gpus:
            try:
                snap.gpus.append(self._sample(gpu))
            except pynvml.NVMLError as e:  # GPU lost mid-run: report it, keep the others
                snap.unavailable[f"nvml:{gpu.index}"] = f"unavailable: GPU {gpu.index}: {e}"
        by_index = {g.index: g for g in snap.gpus}
        for gpu, x in self._xid_events():
            s = by_index.get(gpu.index)
            if s is None:  # a GPU that fell off the bus has no reading, but its XID is the news
                s = by_index[gpu.index] = GpuSample(index=gpu.index, uuid=gpu.uuid, name=gpu.name)
                snap.gpus.append(s)
            s.xid = [*(s.xid or []), x]
