"""CPU facts: its own code on the CPU, a host short of cores, host memory moving."""

from __future__ import annotations

from hangd.analysis.facts import RankIn
from hangd.analysis.signals import ProcSignals
from hangd.analysis.thresholds import Thresholds


def starved(s: ProcSignals, th: Thresholds) -> bool:
    """Its main thread wants the CPU most of the time and gets some: it works, slowed by a host
    short of cores (a thread that waits sleeps; it is not runnable)."""
    return s.r_fraction >= th.runnable_fraction and s.state == "R" and (s.cpu_cores or 0) >= 2 * th.cpu_active_cores


def runs_on_cpu(r: RankIn) -> bool:
    """Its main thread runs (state R) on at least ``busy_cpu_cores``; a side thread alone (a dump
    being written) is not the job working."""
    return (r.s.cpu_cores or 0) >= r.th.busy_cpu_cores and r.s.state == "R"


def starved_of_cores(r: RankIn) -> bool:
    """Runnable most of the window on a host short of CPU (``starved``)."""
    return starved(r.s, r.th)


def on_cpu(r: RankIn) -> bool:
    """It works on the CPU: running on a core, or starved of one."""
    return runs_on_cpu(r) or starved(r.s, r.th)


def cpu_active(r: RankIn) -> bool:
    """It uses at least ``cpu_active_cores``."""
    return (r.s.cpu_cores or 0) >= r.th.cpu_active_cores


def host_memory_moves(r: RankIn) -> bool:
    """Its host memory changed by ``rss_change_bytes`` or more over the window: a checkpoint's
    tensors coming off the GPU, a dataset decoded."""
    return r.s.rss_change is not None and abs(r.s.rss_change) >= r.th.rss_change_bytes


def progressed_recently(r: RankIn) -> bool:
    """It made strong progress of its own within the window (the progress book says which)."""
    return r.ctx.progressed_recently
