"""GPU facts: its own kernels running or spinning, a capture's short bursts."""

from __future__ import annotations

from hangd.analysis.facts import RankIn


def gpu_works(r: RankIn) -> bool:
    """Most readings of the window show its GPU doing real work."""
    return r.s.gpu.works(r.th)


def gpu_spins(r: RankIn) -> bool:
    """Most readings show a kernel resident on its GPU doing nothing: a collective waiting."""
    return r.s.gpu.spins(r.th)


def gpu_active(r: RankIn) -> bool:
    """Its GPU is busy (utilization at the active mark) or works."""
    return r.s.gpu.active(r.th)


def memory_grows_in_bursts(r: RankIn) -> bool:
    """GPU memory grows at a capture's rate in both halves of the window while the GPU is not
    saturated: graphs captured one batch size after another."""
    s, th, g = r.s, r.th, r.s.gpu
    growing = min(s.gpu_mem_rate, s.gpu_mem_rate_before) >= th.capture_growth_per_s
    saturated = (g.util or 0) >= th.saturated_util_pct and (g.sm or 0) >= th.saturated_sm_pct
    return growing and not saturated


def drives_gpu(r: RankIn) -> bool:
    """Kernels keep running and its main thread wakes hundreds of times a second to feed them: a
    step bound by a slow transport shows little SM and no tensor work."""
    return (r.s.gpu.util or 0) >= r.th.gpu_active_util_pct and (r.s.wakes_per_s or 0) >= r.th.driving_wakes_per_s


def has_gpu(r: RankIn) -> bool:
    """It uses a GPU."""
    return bool(r.s.gpu_indexes)
