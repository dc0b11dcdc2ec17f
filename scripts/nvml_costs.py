"""What NVML and GPM return on this host, what each call costs, and what one hangd tick costs.
Prints one JSON object."""

from __future__ import annotations

import json
import statistics
import sys
import time

import pynvml


def timed(fn, *args, n: int = 50):
    ts, val, err = [], None, None
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            val = fn(*args)
        except pynvml.NVMLError as e:
            err = str(e)
        ts.append((time.perf_counter() - t0) * 1000)
    ts.sort()
    return {"median_ms": round(statistics.median(ts), 4), "p99_ms": round(ts[int(len(ts) * 0.99) - 1], 4), "error": err}, val


def main() -> None:
    pynvml.nvmlInit()
    out: dict = {"driver": pynvml.nvmlSystemGetDriverVersion(), "count": pynvml.nvmlDeviceGetCount(), "calls": {}}
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    calls = {
        "utilization": (pynvml.nvmlDeviceGetUtilizationRates, h),
        "memory": (pynvml.nvmlDeviceGetMemoryInfo, h),
        "power": (pynvml.nvmlDeviceGetPowerUsage, h),
        "sm_clock": (pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
        "temperature": (pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
        "energy": (pynvml.nvmlDeviceGetTotalEnergyConsumption, h),
        "compute_processes": (pynvml.nvmlDeviceGetComputeRunningProcesses, h),
        "clock_event_reasons": (pynvml.nvmlDeviceGetCurrentClocksEventReasons, h),
        "pcie_throughput (not used by hangd)": (pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES),
    }
    for name, (fn, *args) in calls.items():
        out["calls"][name], val = timed(fn, *args, n=20 if "pcie" in name else 50)
    try:
        out["gpm_supported"] = bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
    except pynvml.NVMLError as e:
        out["gpm_supported"] = f"error: {e}"
    sys.path.insert(0, ".")
    from hangd.config import load_settings
    from hangd.snapshot import Snapshot
    from hangd.sources.live import LiveNode
    from hangd.sources.nvml import NvmlSource

    src = NvmlSource()
    s = Snapshot(t=0)
    src.collect(s)
    ts = []
    for i in range(40):
        s = Snapshot(t=i)
        t0 = time.perf_counter()
        src.collect(s)
        ts.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.05)
    ts.sort()
    out["nvml_tick_ms_all_gpus"] = {"median": round(statistics.median(ts), 3), "p99": round(ts[-1], 3)}
    out["sample"] = [{k: v for k, v in g.__dict__.items()} if hasattr(g, "__dict__") else
                     {f: getattr(g, f) for f in g.__slots__} for g in s.gpus]
    node = LiveNode(load_settings(flags={}, env={}))
    node.sample()
    ticks, per = [], {}
    for _ in range(20):
        t0 = time.perf_counter()
        node.sample()
        ticks.append((time.perf_counter() - t0) * 1000)
        for k, st in node.runner.stats.items():
            per.setdefault(k, []).append(st.duration_s * 1000)
        time.sleep(0.05)
    ticks.sort()
    out["hangd_tick_ms"] = {"median": round(statistics.median(ticks), 3), "max": round(ticks[-1], 3),
                            "per_source_median": {k: round(statistics.median(v), 3) for k, v in per.items()}}
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
