"""The GPU series of /metrics: a reading NVML did not give is left out, never exported as 0."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, generate_latest

from hangd.config import Settings
from hangd.daemon import TraceFeed
from hangd.server.metrics import HangdCollector
from hangd.server.runtime import Daemon
from hangd.store.db import Store

from ..conftest import TRACES


def _gpu_lines(tmp_path, strip: tuple[str, ...]) -> dict[str, str]:
    """/metrics' GPU 0 lines (name -> value) after one recorded H200 reading with ``strip`` GPM keys
    taken out, the way NVML leaves out a metric whose nvmlReturn is not success."""
    feed = TraceFeed(str(TRACES / "nccl_stall"))
    snap = next(s for s in iter(feed.sample, None) if any(g.gpm for g in s.gpus))
    snap.gpus = [dataclasses.replace(g, gpm={k: v for k, v in (g.gpm or {}).items() if k not in strip})
                 for g in snap.gpus]
    settings = Settings(db=f"sqlite:///{tmp_path / 'h.db'}", nvml=False, stacks=False)
    d = Daemon(settings, store=Store(settings.db))
    try:
        d.front.step(snap, feed)
        reg = CollectorRegistry()
        reg.register(HangdCollector(d))
        text = generate_latest(reg).decode()
    finally:
        d.store.close()
    return {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in text.splitlines()
            if line.startswith("hangd_gpu_") and 'gpu="0"' in line}


def test_gpm_values_nvml_did_not_give_are_absent_not_zero(tmp_path):
    full = _gpu_lines(tmp_path / "a", ())
    assert {"hangd_gpu_sm_active_ratio", "hangd_gpu_tensor_active_ratio", "hangd_gpu_dram_active_ratio",
            "hangd_gpu_nvlink_bytes_per_second", "hangd_gpu_power_watts"} <= set(full)
    part = _gpu_lines(tmp_path / "b", ("ANY_TENSOR_UTIL", "NVLINK_TOTAL_RX_PER_SEC"))
    assert "hangd_gpu_tensor_active_ratio" not in part
    assert "hangd_gpu_nvlink_bytes_per_second" not in part  # half of tx+rx is not the sum
    assert part["hangd_gpu_sm_active_ratio"] == full["hangd_gpu_sm_active_ratio"]
    assert part["hangd_gpu_dram_active_ratio"] == full["hangd_gpu_dram_active_ratio"]
