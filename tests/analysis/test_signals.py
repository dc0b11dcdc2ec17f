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
