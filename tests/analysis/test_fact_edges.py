"""Facts and words at their edges: the values no recording sits on, read the way the docs say."""

from __future__ import annotations

from hangd.analysis import hardware, rankstate
from hangd.analysis.engine import Analyzer
from hangd.analysis.facts import Context, RankIn
from hangd.analysis.facts.cpu import starved
from hangd.analysis.signals import GpuSignals, ProcSignals
from hangd.analysis.thresholds import Thresholds

TH = Thresholds()


def test_a_process_runnable_most_of_the_window_is_starved_from_twice_the_idle_mark():
    s = ProcSignals(pid=7, age_s=60.0, state="R", r_fraction=TH.runnable_fraction, cpu_cores=2 * TH.cpu_active_cores)
    assert starved(s, TH)
    s.cpu_cores = 2 * TH.cpu_active_cores * 0.99
    assert not starved(s, TH)
    s.cpu_cores, s.r_fraction = 1.0, TH.runnable_fraction * 0.99
    assert not starved(s, TH)
    s.r_fraction, s.state = 1.0, "S"
    assert not starved(s, TH)


def test_a_capture_reading_with_no_utilization_given_says_zero():
    s = ProcSignals(pid=7, age_s=60.0, gpu=GpuSignals(util=None, sm=None), gpu_mem_rate=300e6)
    why = rankstate._capture_why(RankIn(s, Context(), TH))
    assert why.endswith("(util 0%, SM 0%)"), why
    assert "growing 300 MB/s" in why, why


def test_every_clock_event_reason_nvml_reports_has_a_name_for_the_metrics():
    names = hardware.clock_event_names()
    assert {"gpu_idle", "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown"} <= set(names), names


def test_a_fresh_analyzer_has_dropped_nothing():
    assert Analyzer().dropped == {"changes": 0, "findings": 0, "processes": 0, "jobs": 0}
