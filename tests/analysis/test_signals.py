"""A process's signals where the recorded traces do not reach, on small hand-made snapshots: which
process a spinning GPU's activity belongs to, and CPU use at the clock-tick rate a sample carries."""

from __future__ import annotations

from hangd.analysis.engine import Analyzer
from hangd.snapshot import GpuProc, GpuSample, ProcInfo, ProcSample, Snapshot

SPIN = {"SM_UTIL": 18.0, "ANY_TENSOR_UTIL": 0.0, "DRAM_BW_UTIL": 0.0, "NVLINK_TOTAL_TX_PER_SEC": 0.0}


def _snap(t: float, sm_of: dict[int, int]) -> Snapshot:
    g = GpuSample(index=0, util_gpu=100, util_mem=0, mem_used=20 << 30, power_mw=124_000, gpm=dict(SPIN),
                  procs=[GpuProc(pid=p, used=5 << 30) for p in sm_of],
                  proc_util=[{"pid": p, "sm": sm, "mem": 0, "ts": 0} for p, sm in sm_of.items()])
    procs = [ProcSample(pid=p, ppid=1, state="S", utime=0, stime=0, threads=10, wchan="futex_do_wait", rss_bytes=1 << 30,
                        io={"read_bytes": 0, "write_bytes": 0, "rchar": 0, "wchar": 0}, role="worker") for p in sm_of]
    infos = [ProcInfo(pid=p, ppid=1, environ={"MASTER_ADDR": "h", "MASTER_PORT": str(p), "RANK": "0"})
             for p in sm_of] if t == 0 else []
    return Snapshot(t=t, gpus=[g], procs=procs, infos=infos)


def test_a_process_sharing_a_spinning_gpu_is_not_the_one_spinning():
    an = Analyzer()
    for i in range(120):  # 30 s at 4 Hz: pid 10 spins in a collective, pid 20 only shares the GPU
        an.step(_snap(i / 4, {10: 99, 20: 0}))
    states = {s["pid"]: s["state"] for s in an.process_states()}
    assert states[10] == "hung"
    assert states[20] in ("starting", "idle"), states
    assert [i.kind for i in an.incidents()] == ["nccl_stall"]
    assert an.incidents()[0].pids == [10]


def test_a_rank_whose_gpu_spins_for_a_process_of_another_namespace_is_not_the_one_spinning():
    """Two nodes of a job on one GPU (a PID namespace each): this hangd lists only its own rank
    (pid 2), which waits on an event, while the rank outside, listed nowhere here, spins in the
    collective (its samples come under its host pid, 469). The rank here must not read as
    waiting in a collective: it is the one the other waits for. With the roles swapped, it is."""
    def snap(t: float, util: list[dict]) -> Snapshot:
        g = GpuSample(index=0, util_gpu=100, util_mem=0, mem_used=1962344448, power_mw=124_000, gpm=dict(SPIN),
                      procs=[GpuProc(pid=2, used=660602880)], proc_util=util)
        p = ProcSample(pid=2, ppid=1, state="S", utime=0, stime=0, threads=10, wchan="futex_do_wait", rss_bytes=1 << 30,
                       io={"read_bytes": 0, "write_bytes": 0, "rchar": 0, "wchar": 0}, role="worker")
        infos = [ProcInfo(pid=2, ppid=1, environ={"MASTER_ADDR": "h", "MASTER_PORT": "29500", "RANK": "1",
                                                 "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"})] if t == 0 else []
        return Snapshot(t=t, gpus=[g], procs=[p], infos=infos)

    for util, spins in (([{"pid": 469, "sm": 98, "mem": 0, "ts": 0}], False),
                        ([{"pid": 2, "sm": 53, "mem": 0, "ts": 0}, {"pid": 569, "sm": 1, "mem": 0, "ts": 0}], True)):
        an = Analyzer()
        for i in range(80):  # 20 s at 4 Hz
            an.step(snap(i / 4, util))
        (p,) = an.processes()
        assert ("spinning in a GPU collective" in p["reason"]) is spins, p["reason"]
        assert (p.get("waits") is True) is spins, p


def _cpu_cores(clk_tck: int | None) -> float | None:
    """A process's CPU use over 2 s in which its utime grew by 1000 ticks."""
    from hangd.analysis.nodeview import NodeView
    from hangd.analysis.signals import proc_signals
    from hangd.analysis.thresholds import Thresholds

    th = Thresholds()
    view = NodeView(th)
    for t, ticks in ((0.0, 0), (1.0, 500), (2.0, 1000)):
        view.feed(Snapshot(t=t, procs=[ProcSample(pid=10, ppid=1, state="R", utime=ticks, stime=0, threads=1,
                                                  clk_tck=clk_tck)]))
    return proc_signals(view, 10, 2.0, th).cpu_cores


def test_cpu_use_counts_clock_ticks_at_the_rate_the_sample_carries():
    # a host whose SC_CLK_TCK is 1000: 1000 ticks are 1 s
    assert _cpu_cores(1000) == 0.5
    # a trace recorded before samples carried the rate was read at 100 a second
    assert _cpu_cores(None) == 5.0


# rchar read in each 0.25 s between readings, in MB, over a 6 s window (tests/data/traces)
SLOW_SHARDS = [34, 34, 0, 67, 42, 34, 0, 67, 34, 0, 59, 0, 67, 33, 34, 34, 34, 0, 67, 0, 67, 25, 0, 67, 33, 42]
# h200x2-more/hf_slow_shards pid 877, 30.25-36.5 s: page-cache reads throttled to ~130 MB/s
LOADED_THEN_TRAINS = [126, 143, 143, 134, 134, 134, 134, 126, 134, 126, 134, 134, 126, 126, 50, 0, 1, 1, 2, 1, 1, 1, 1, 1, 1]
# matrix-gpu/mpargv-load_disk-none pid 710, 7.75-14 s: its shards, then 4 MB/s of small reads while it trains


def _reader(mb_per_reading: list[int]):
    from hangd.analysis.nodeview import NodeView
    from hangd.analysis.signals import proc_signals
    from hangd.analysis.thresholds import Thresholds

    th = Thresholds()
    view = NodeView(th)
    total, t = 0, 0.0
    for i, mb in enumerate([0, *mb_per_reading]):
        total += mb * 10**6
        t = i * 0.25
        view.feed(Snapshot(t=t, procs=[ProcSample(pid=10, ppid=1, state="S", utime=0, stime=0, threads=1,
                                                  io={"read_bytes": 0, "write_bytes": 0, "rchar": total, "wchar": 0})]))
    return proc_signals(view, 10, t, th), th


def test_a_throttled_reader_keeps_moving_through_its_sleeps():
    from hangd.analysis.facts import io as local

    s, th = _reader(SLOW_SHARDS)
    assert s.in_counter == "rchar" and s.in_quiet_s == 0.0
    assert s.in_pause_s == 0.5  # its longest sleep between two bursts at its own rate
    assert local.moves(s, th, "in")


def test_reads_that_ended_longer_ago_than_the_readers_own_pauses_have_stopped():
    from hangd.analysis.facts import io as local

    s, th = _reader(LOADED_THEN_TRAINS)
    # the 6 s window still averages far above a loader's rate, but its last burst is 2.75 s old
    assert (s.in_long_per_s or 0) > 250e6
    assert s.in_quiet_s == 2.75 and s.in_pause_s == 0.0
    assert not local.moves(s, th, "in")
