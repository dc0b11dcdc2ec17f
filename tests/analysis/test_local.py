"""The per-process classifier as a table: signals in, reading out. Each row is a phase seen on
real hardware (FIELD-NOTES and the recorded traces), with the line between neighbours."""

from __future__ import annotations

import pytest

from hangd.analysis import stackcat
from hangd.analysis.facts import Context
from hangd.analysis.model import Local
from hangd.analysis.rankstate import classify
from hangd.analysis.signals import GpuSignals, ProcSignals
from hangd.analysis.thresholds import Thresholds

TH = Thresholds()
GiB = 1 << 30
STACK = {k: stackcat.Verdict(k, k, "f.py:fn:1", "MainThread", 50) for k in
         ("collective", "store", "request_wait", "loading", "compiling", "graph_capture", "lock_wait", "computing")}


def sig(**kw) -> ProcSignals:
    gpu = kw.pop("gpu", None)
    s = ProcSignals(pid=1, age_s=kw.pop("age_s", 60.0), state=kw.pop("state", "S"), wchan=kw.pop("wchan", "futex_do_wait"))
    if gpu is not None:
        s.gpu_indexes, s.gpu_mem = [0], 20 * GiB
        s.gpu = gpu
    for k, v in kw.items():
        setattr(s, k, v)
    return s


WORKS = GpuSignals(util=99, sm=85, tensor=80, dram=17, nvlink_mibs=17000, power_w=470, has_gpm=True, work_frac=1.0)
DECODE = GpuSignals(util=60, sm=5, tensor=0.1, dram=2.2, nvlink_mibs=80, power_w=165, has_gpm=True, work_frac=1.0)
SPINS = GpuSignals(util=100, sm=18, tensor=0, dram=0, nvlink_mibs=0, power_w=124, has_gpm=True, spin_frac=1.0)
IDLE = GpuSignals(util=0, sm=0, tensor=0, dram=0, nvlink_mibs=0, power_w=122, has_gpm=True)
CAPTURE = GpuSignals(util=66, sm=50, tensor=33, dram=13, power_w=570, has_gpm=True, work_frac=0.4)

ROWS = [
    # (name, signals, context verdict, expected)
    ("matmul loop", sig(gpu=WORKS, state="R", cpu_cores=1.0), None, Local.BUSY),
    ("token-by-token generation (light but real work)", sig(gpu=DECODE), None, Local.BUSY),
    ("NCCL kernel spinning for a peer", sig(gpu=SPINS, state="R", cpu_cores=1.0), None, Local.SPINNING),
    ("host-side collective wait (stack)", sig(gpu=IDLE), "collective", Local.WAITING),
    ("process-group handshake (stack)", sig(gpu=IDLE, wchan="poll_schedule_timeout"), "store", Local.WAITING),
    ("idle server in accept()", sig(gpu=IDLE, wchan="inet_csk_accept"), None, Local.SERVING),
    ("idle server (stack)", sig(gpu=IDLE), "request_wait", Local.SERVING),
    ("loading shards from cold disk", sig(gpu=IDLE, state="D", d_fraction=1.0, read_per_s=800e6, gpu_mem_rate=400e6),
     None, Local.LOADING),
    ("slow reader: bursts with sleeps, S in nanosleep", sig(gpu=IDLE, wchan="hrtimer_nanosleep", read_per_s=60e6,
                                                             in_long_per_s=130e6, in_active_s=5, in_counter="read_bytes"),
     None, Local.LOADING),
    # when the reads of the I/O window end (readings of tests/data/traces, at the tick named)
    ("slow reader between two bursts (h200x2-more/hf_slow_shards pid 877 at 33.75 s)",
     sig(gpu=IDLE, wchan="hrtimer_nanosleep", cpu_cores=0.03, rchar_per_s=130.5e6, in_long_per_s=136.9e6, in_active_s=7,
         in_counter="rchar", in_quiet_s=0.5, in_pause_s=1.0), None, Local.LOADING),
    ("reader whose sleeps are 3 s, 2.5 s into one (the same reader, slower)",
     sig(gpu=IDLE, wchan="hrtimer_nanosleep", cpu_cores=0.03, in_long_per_s=60e6, in_active_s=3, in_counter="rchar",
         in_quiet_s=2.5, in_pause_s=3.0), None, Local.LOADING),
    ("read its weights, trains on the CPU 3 s later (matrix-gpu/mpargv-load_disk-none pid 710 at 14 s)",
     sig(gpu=IDLE, state="R", wchan="0", age_s=13.8, cpu_cores=1.0, r_fraction=1.0, rchar_per_s=4.5e6, in_long_per_s=274.5e6,
         in_active_s=7, in_counter="rchar", in_quiet_s=3.0), None, Local.CPU),
    ("a trickle of reads after its shards (matrix-cpu/spawn-load_disk-none pid 11854 at 18 s)",
     sig(state="R", wchan="0", age_s=15.4, cpu_cores=0.38, r_fraction=0.78, rchar_per_s=9.5e6, in_long_per_s=96.6e6,
         in_active_s=5, in_counter="rchar", in_quiet_s=4.27), None, Local.CPU),
    ("stack in the store 1 s after its reads (matrix-cpu/spawn-load_slow-exit_early-store pid 12034 at 21.25 s)",
     sig(wchan="poll_schedule_timeout.constprop.0", age_s=19.5, cpu_cores=0.04, rchar_per_s=71.2e6, in_long_per_s=103.5e6,
         out_long_per_s=3.2e6, in_active_s=6, in_counter="rchar", in_quiet_s=1.0, in_pause_s=0.25), "store", Local.WAITING),
    # a stack in its own model's forward pass or optimizer step: it works, whatever comes in meanwhile
    ("forward pass while CUDA libraries page in (matrix-gpu/mpargv-checkpoint-exit_early-collective pid 455 at 11 s)",
     sig(gpu=GpuSignals(util=5.2, sm=1, tensor=0, dram=0, power_w=130, has_gpm=True), age_s=11.2, cpu_cores=0.78,
         read_per_s=30e6, gpu_mem_rate=347e6, in_long_per_s=60e6, in_active_s=3, in_counter="read_bytes"),
     "computing", Local.BUSY),
    ("optimizer step on the CPU (gloo)", sig(state="R", wchan="0", cpu_cores=1.0), "computing", Local.BUSY),
    ("a forward pass's stack, its GPU now spinning in a collective", sig(gpu=SPINS, state="R", cpu_cores=1.0), "computing",
     Local.SPINNING),
    # bytes from the disk with next to no read calls: pages of mapped files coming in
    ("a compiled kernel's library paged in as it sleeps (matrix-cpu/parent-compile-none pid 23426 at 40.7 s)",
     sig(wchan="hrtimer_nanosleep", age_s=40.0, cpu_cores=0.08, rchar_per_s=5.6e6, read_per_s=72.8e6, in_long_per_s=27.9e6,
         in_active_s=2, in_counter="read_bytes", in_quiet_s=1.25, in_pause_s=4.0, rss_change=2_711_552), None, Local.QUIET),
    ("weights mapped by safetensors come in the same way, and fill its memory",
     sig(wchan="hrtimer_nanosleep", age_s=40.0, cpu_cores=0.08, rchar_per_s=5.6e6, read_per_s=72.8e6, in_long_per_s=27.9e6,
         in_active_s=2, in_counter="read_bytes", in_quiet_s=1.25, in_pause_s=4.0, rss_change=140_000_000), None, Local.LOADING),
    # ... and host memory growing far faster than pages come in is a process allocating as its
    # libraries page in (CUDA's first kernels after a load), not a loader: one maps its weights
    # and makes tensors of them, two copies at most
    ("first kernels after its load (matrix-gpu/mpargv-load_disk-none pid 715 at 16.5 s)",
     sig(gpu=IDLE, state="R", wchan="0", age_s=16.5, cpu_cores=0.92, r_fraction=0.9, d_fraction=0.11, read_per_s=34.7e6,
         rchar_per_s=4.06e6, rss_change=227_483_648, gpu_mem_rate=53.5e6, in_long_per_s=101e6, in_active_s=6,
         in_counter="read_bytes", in_quiet_s=0, in_pause_s=3.0), None, Local.CPU),
    ("safetensors shards mapped onto the GPU (h200x1-hf/healthy pid 583 at 19 s)",
     sig(gpu=IDLE, age_s=14.2, cpu_cores=0.65, d_fraction=0.56, read_per_s=485e6, rchar_per_s=3.26e6,
         rss_change=1_897_091_072, gpu_mem_rate=2.02e9, in_long_per_s=202e6, in_active_s=7, in_counter="read_bytes",
         in_quiet_s=0), None, Local.LOADING),
    ("imports at start read into nothing", sig(age_s=3.0, read_per_s=50e6, rchar_per_s=50e6), None, Local.QUIET),
    ("graph capture: memory grows while the GPU runs bursts",
     sig(gpu=CAPTURE, state="R", gpu_mem_rate=300e6, gpu_mem_rate_before=300e6), None, Local.GRAPH_CAPTURE),
    ("compile workers under it", sig(gpu=IDLE, state="R", cpu_cores=1.0, compile_children=8), None, Local.COMPILING),
    # inductor's single compile of a small graph (compile_threads=1): one compiler process under it
    ("one compiler process under it", sig(gpu=IDLE, state="R", cpu_cores=0.4, compile_children=1), None,
     Local.COMPILING),
    ("stopped", sig(gpu=SPINS, state="T"), None, Local.STOPPED),
    ("zombie", sig(state="Z"), None, Local.ZOMBIE),
    ("uninterruptible I/O, no bytes moving", sig(gpu=IDLE, state="D", d_fraction=1.0, wchan="nfs_wait"), None, Local.IO_WAIT),
    ("blocked on an event (the culprit of a host-side hang)", sig(gpu=IDLE), "lock_wait", Local.QUIET),
    ("on CPU with no proof of progress", sig(state="R", cpu_cores=1.0), None, Local.CPU),
    ("sleeping, nothing known", sig(gpu=IDLE), None, Local.QUIET),
]


@pytest.mark.parametrize(("name", "s", "verdict", "want"), ROWS, ids=[r[0] for r in ROWS])
def test_classify(name, s, verdict, want):
    ctx = Context(verdict=STACK[verdict] if verdict else stackcat.UNKNOWN)
    got = classify(s, ctx, TH)
    assert got.local == want, f"{name}: {got}"
    assert len(got.why) > 10


def test_cpu_work_that_progresses_is_busy():
    got = classify(sig(state="R", cpu_cores=1.0), Context(progressed_recently=True, progress_why="it wrote to its log"), TH)
    assert got.local == Local.BUSY and "it wrote to its log" in got.why


def test_a_process_holding_no_gpu_memory_is_not_said_to_hold_it():
    s = sig(gpu=IDLE)
    s.gpu_mem = 0
    assert "GiB held" not in classify(s, Context(), TH).why


def test_classify_is_pure():
    s = sig(gpu=SPINS, state="R")
    before = repr(s)
    a, b = classify(s, Context(), TH), classify(s, Context(), TH)
    assert a == b and repr(s) == before


def test_a_rank_runnable_most_of_the_window_on_a_host_short_of_cores_works():
    # 2 cores at load 15 give a training step 0.2 of one: runnable in most readings is work, not silence
    starved = classify(sig(state="R", wchan="0", cpu_cores=0.2, r_fraction=0.9), Context(), TH)
    assert starved.local == Local.CPU and "host short of CPU" in starved.why
    # a thread that waits sleeps: runnable now and then is not enough, nor is running with no CPU at all
    assert classify(sig(state="R", wchan="0", cpu_cores=0.2, r_fraction=0.3), Context(), TH).local == Local.QUIET
    assert classify(sig(state="R", wchan="0", cpu_cores=0.0, r_fraction=1.0), Context(), TH).local == Local.QUIET


# readings of matrix-gpu/spawn-compile-none pid 1734 at 26 s: compiled steps, a 50 ms sleep between
STEPS = GpuSignals(util=11, sm=0.1, tensor=0, dram=0, nvlink_mibs=0, power_w=130, has_gpm=True)


def test_a_compile_ends_when_its_own_kernels_run_while_it_sleeps():
    from hangd.analysis.facts.stack import compile_goes_on

    stepping = sig(gpu=STEPS, wchan="hrtimer_nanosleep", cpu_cores=0.12)
    stepping.compile_children = 1  # inductor's pool importing torch in the background
    assert not compile_goes_on(stepping, TH)
    # the same pool under a rank whose GPU is idle: it waits for its compile workers, compiling
    waiting = sig(gpu=IDLE, wchan="futex_wait_queue", cpu_cores=0.05)
    waiting.compile_children = 1
    assert compile_goes_on(waiting, TH)
    # a spinning kernel is no compiled program running
    spinning = sig(gpu=SPINS, wchan="hrtimer_nanosleep", cpu_cores=0.05)
    spinning.compile_children = 1
    assert compile_goes_on(spinning, TH)


def test_kernels_between_short_sleeps_drive_the_gpu():
    # 20 steps a second with a sleep between each: its own kernels run, it works
    s = sig(gpu=STEPS, wchan="hrtimer_nanosleep", cpu_cores=0.12)
    s.wakes_per_s = 20.0
    assert classify(s, Context(), TH).local == Local.BUSY
    # the same GPU readings with a main thread that does not wake: no step is running
    s.wakes_per_s = 0.0
    assert classify(s, Context(), TH).local != Local.BUSY
