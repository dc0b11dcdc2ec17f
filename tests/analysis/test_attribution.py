"""The analysis' parts on their own, where the recorded jobs do not reach: the stack catalog as
data, collective mismatches among more than two ranks, a cause quoted from before hangd started,
progress named after the rank that made it, GPUs shared by several processes, orphans' reasons."""

from __future__ import annotations

from hangd.analysis import report
from hangd.analysis.detectors import Env, mismatch
from hangd.analysis.engine import Analyzer
from hangd.analysis.identity import Job
from hangd.analysis.nodeview import NodeView, log_catalog
from hangd.analysis.progress import ProgressBook
from hangd.analysis.signals import _shared, _unseen, _uses_gpu
from hangd.analysis.stackcat import default_catalog, load_catalog
from hangd.analysis.thresholds import Thresholds
from hangd.analysis.views import JobTrack
from hangd.flightrec.analyze import Finding
from hangd.incidents import IncidentBook
from hangd.snapshot import GpuProc, GpuSample

from ..conftest import TRACES
from .builders import GiB, Node, P, torchrun_env

CATALOG = """
[[rule]]
kind = "collective"
priority = 80
why = "in a collective"
patterns = ["distributed_c10d\\\\.py:(all_reduce|broadcast)", "ProcessGroupNCCL"]

[[rule]]
kind = "sleep"
patterns = ["time\\\\.sleep"]

[[rule]]
kind = "store"
priority = 90
why = "waiting on the rendezvous store"
patterns = ["TCPStore"]
"""


def test_a_catalog_is_data_ordered_by_priority_with_defaults_for_what_is_left_out():
    rules = load_catalog(CATALOG)
    assert [(r.kind, r.priority, r.why) for r in rules] == [
        ("store", 90, "waiting on the rendezvous store"), ("collective", 80, "in a collective"), ("sleep", 50, "sleep")]
    coll = rules[1]
    assert [p.pattern for p in coll.patterns] == ["distributed_c10d\\.py:(all_reduce|broadcast)", "ProcessGroupNCCL"]
    assert coll.patterns[0].search("torch/distributed/distributed_c10d.py:all_reduce")
    assert load_catalog("") == []


def test_the_shipped_catalogs_load_uncached_and_name_the_waits_the_traces_show():
    rules = load_catalog()
    assert tuple(rules) == default_catalog()
    kinds = {r.kind for r in rules}
    assert {"collective", "gpu_sync", "loading", "compiling"} <= kinds, kinds
    assert all(a.priority >= b.priority for a, b in zip(rules, rules[1:], strict=False))
    logs = log_catalog.__wrapped__()
    assert logs and all(hasattr(p, "search") for p in logs.values())


def _env() -> Env:
    th = Thresholds()
    return Env(th=th, view=NodeView(th), tracks={}, progress=ProgressBook(th), book=IncidentBook())


def _finding(kind: str, **vals: dict[int, object]) -> Finding:
    ranks = sorted(next(iter(vals.values())))
    return Finding(kind=kind, pg="0", seq=12, op="all_reduce", ranks=ranks, message=f"{kind} at all_reduce #12", **vals)


def test_a_size_mismatch_among_four_ranks_blames_the_one_that_differs():
    env, tr = _env(), JobTrack()
    tr.fr_pids = {0: 100, 1: 101, 2: 102, 3: 103}
    f = _finding("size_mismatch", sizes={0: [[1024]], 1: [[1024]], 2: [[512]], 3: [[1024]]})
    mismatch.step(env, "job", None, tr, f, 50.0)
    (inc,) = env.book.all
    assert inc.kind == "collective_mismatch" and inc.ranks == [0, 1, 2, 3] and inc.pids == [100, 101, 102, 103]
    assert inc.culprit_ranks == [2] and inc.culprit_pids == [102]
    assert inc.summary.startswith("size_mismatch at all_reduce #12. The ranks disagree on one collective")
    assert inc.evidence["flight_recorder"] == [f.to_dict()]
    # a second finding for the same job joins the open incident
    f2 = _finding("op_mismatch", ops={0: "all_reduce", 1: "all_reduce", 2: "all_reduce", 3: "broadcast"})
    mismatch.step(env, "job", None, tr, f2, 55.0)
    assert len(env.book.all) == 1 and len(inc.findings) == 2 and inc.culprit_ranks == [2]
    assert inc.updated_at == 55.0


def test_an_op_or_dtype_mismatch_blames_by_its_own_field_and_prefers_the_job_s_pids():
    for kind, field, vals, odd in [
        ("op_mismatch", "ops", {0: "all_reduce", 1: "broadcast", 2: "all_reduce"}, [1]),
        ("dtype_mismatch", "dtypes", {0: "Float", 1: "Float", 2: "Half"}, [2]),
    ]:
        env, tr = _env(), JobTrack()
        tr.fr_pids = {0: 100, 1: 101, 2: 102}
        job = Job(id="job", name="job", ranks={200: 0, 201: 1, 202: 2})
        mismatch.step(env, "job", job, tr, _finding(kind, **{field: vals}), 50.0)
        (inc,) = env.book.all
        assert inc.culprit_ranks == odd, kind
        assert inc.culprit_pids == [200 + odd[0]] and inc.pids == [200, 201, 202]


def test_two_ranks_that_disagree_blame_the_higher_one():
    env, tr = _env(), JobTrack()
    mismatch.step(env, "job", None, tr, _finding("size_mismatch", sizes={0: [[8]], 1: [[4]]}), 1.0)
    (inc,) = env.book.all
    assert inc.culprit_ranks == [1] and inc.culprit_pids == [] and inc.pids == []


def test_a_cause_is_quoted_with_where_and_when_it_was_seen():
    line = "RuntimeError: shape mismatch: hidden size 4096 vs 5120"
    assert report.quote_exception({"t": None, "rank": None, "file": "/job/log", "line": line}) == \
        f"the job's log (/job/log) (already in the log when hangd first read it): {line}"
    quoted = report.quote_exception({"t": 1_796_000_000.0, "rank": 3, "file": "/job/log3", "line": line})
    assert quoted.startswith("rank 3's log (/job/log3) at ") and quoted.endswith(f": {line}")
    assert "already there" not in quoted


def test_progress_is_named_after_the_process_that_made_it_last():
    pb = ProgressBook(Thresholds())
    pb.credit(11, 100.0, "GPU work", strong=True)
    pb.credit(12, 105.0, "log grew", strong=True)
    pb.credit(13, 110.0, "host memory changing", strong=False)
    assert pb.why_strongest([11, 12, 13]) == "pid 12: log grew"
    assert pb.why_strongest([13, 11]) == "pid 11: GPU work"
    pb.forget(12)
    assert pb.of(12).last is None and pb.why_strongest([12, 11]) == "pid 11: GPU work"
    pb.forget(4242)  # forgetting a pid never seen is fine


def _gpu(util: list[dict] | None) -> GpuSample:
    return GpuSample(index=0, util_gpu=100, util_mem=0, mem_used=4 * GiB, mem_total=141 * GiB, power_mw=124_000,
                     procs=[GpuProc(pid=1, used=2 * GiB), GpuProc(pid=2, used=2 * GiB)], proc_util=util)


def test_on_a_shared_gpu_only_processes_with_sm_time_own_its_activity():
    assert _uses_gpu(1, [_gpu(None)]) is True  # no per-process data: cannot tell them apart
    assert _uses_gpu(1, [_gpu([])]) is True
    shared = [_gpu([{"pid": 1, "sm": 0}, {"pid": 2, "sm": 1}])]
    assert _uses_gpu(2, shared) is True
    assert _uses_gpu(1, shared) is False
    assert _uses_gpu(1, [_gpu([{"pid": 2, "sm": 40}]), _gpu([{"pid": 1, "sm": None}])]) is False


def test_a_gpu_is_shared_with_a_process_of_another_pid_namespace_when_only_its_samples_name_it():
    """NVML as a hangd in its own PID namespace reads it (an H200, two probes): the GPU lists only
    the namespace's process (pid 2 there), the utilization samples also the other processes on it,
    under their host pids."""
    def ns(util: list[dict], procs: tuple[int, ...] = (2,)) -> GpuSample:
        return GpuSample(index=0, util_gpu=100, util_mem=0, mem_used=1962344448, mem_total=141 * GiB, power_mw=124_000,
                         procs=[GpuProc(pid=p, used=660602880) for p in procs], proc_util=util)
    outside_spins = [ns([{"pid": 469, "sm": 98, "mem": 0}])]
    assert _shared(outside_spins) and _uses_gpu(2, outside_spins) is False  # the activity is not pid 2's
    inside_spins = [ns([{"pid": 2, "sm": 53, "mem": 0}, {"pid": 569, "sm": 1, "mem": 0}])]
    assert _shared(inside_spins) and _uses_gpu(2, inside_spins) is True
    assert not _shared([ns([{"pid": 2, "sm": 90, "mem": 0}])])  # alone on it
    assert not _shared([ns([{"pid": 469, "sm": 0, "mem": 0}])])  # the other one does nothing
    # a process that was listed in the window and has exited is not a hidden one
    assert not _shared([ns([], procs=(2, 3)), ns([{"pid": 3, "sm": 40, "mem": 0}])])


def test_memory_no_listed_process_holds_is_a_process_hangd_cannot_see():
    """As one H200 read with two jobs side by side, a recorder listing one job's ranks: 4044 MiB in
    use, the two ranks listed holding 520 MiB each, the driver's own 615 MiB when the GPU was empty."""
    MiB, th = 1 << 20, Thresholds()

    def g(used: int, procs: tuple[int, ...]) -> GpuSample:
        return GpuSample(index=0, util_gpu=100, util_mem=0, mem_used=used * MiB, mem_total=141 * GiB, power_mw=124_000,
                         procs=[GpuProc(pid=i + 1, used=p * MiB) for i, p in enumerate(procs)])
    assert _unseen([g(4044, (520, 520))] * 8, 615 * MiB, th)
    assert not _unseen([g(615 + 1040, (520, 520))] * 8, 615 * MiB, th)  # all of it theirs
    assert not _unseen([g(615 + 1040 + 200, (520, 520))] * 8, 615 * MiB, th)  # less than a context
    # a blip (a process listed a reading late) is not one: most of the window must show it, over 3
    # readings at least (a window of 1 Hz readings holds few)
    assert not _unseen([g(4044, (520, 520))] * 3 + [g(1655, (520, 520))] * 5, 615 * MiB, th)
    assert not _unseen([g(4044, (520, 520))] * 2, 615 * MiB, th)
    assert not _unseen([g(4044, (520, 520))] * 2 + [g(1655, (520, 520))] * 2, 615 * MiB, th)
    # NVML gives no process's memory (MIG without privileges, vGPU): nothing can be told
    blind = GpuSample(index=0, util_gpu=100, util_mem=0, mem_used=40000 * MiB, mem_total=141 * GiB, power_mw=124_000,
                      procs=[GpuProc(pid=1, used=None), GpuProc(pid=2, used=None)])
    assert not _unseen([blind] * 8, 615 * MiB, th)


def test_an_orphan_is_told_by_its_gone_launcher_and_new_parent():
    node = Node([P(10, 1, cmdline=["torchrun", "train.py"]),
                 P(11, 10, torchrun_env(0, 2), gpu=0), P(12, 10, torchrun_env(1, 2), gpu=1)])
    node.run(5)
    node.kill(10)
    node.procs[11].ppid = node.procs[12].ppid = 1
    node.run(12)
    reasons = {p["pid"]: p["reason"] for p in node.an.processes()}
    assert "its launcher (pid 10) is gone; re-parented to pid 1" in reasons[11], reasons


def test_what_was_forgotten_is_counted_by_kind():
    an = Analyzer()
    got = an.forgotten()
    assert set(got) >= {"incidents", "processes", "changes"} and got["incidents"] == 0


def test_an_exception_in_a_log_shared_by_ranks_is_given_to_the_rank_its_prefix_names():
    node = Node([P(10, 1, cmdline=["torchrun", "train.py"], log="/job/launcher.log"),
                 P(11, 10, torchrun_env(0, 2), gpu=0, log="/job/out"), P(12, 10, torchrun_env(1, 2), gpu=1, log="/job/out"),
                 P(21, 1, torchrun_env(0, 1, port=29700), gpu=2, log="/job/solo")])
    node.write_log("/job/out", "[rank0]: step 1\n")
    node.write_log("/job/launcher.log", "starting 2 workers\n")
    node.write_log("/job/solo", "RuntimeError: shape mismatch (already in the log before hangd started)\n")
    node.run(2)
    node.write_log("/job/out", "[rank1]: Traceback (most recent call last):\n[rank1]: RuntimeError: CUDA error: an illegal memory access\n")
    node.run(1)
    node.write_log("/job/launcher.log", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED\n")
    node.run(1)
    jobs = {j.launcher: j for j in node.an.job_defs.values()}
    ex = report.exceptions(node.an.view, jobs[10], since=0.0)
    assert [(e["file"], e["rank"]) for e in ex] == [("out", 1), ("launcher.log", None)], ex
    assert ex[0]["line"] == "[rank1]: RuntimeError: CUDA error: an illegal memory access"
    assert ex[0]["t"] < ex[1]["t"]
    assert report.exceptions(node.an.view, jobs[10], since=ex[1]["t"] + 1) == []
    (solo,) = report.exceptions(node.an.view, jobs[1] if 1 in jobs else next(j for j in jobs.values() if 21 in j.ranks), 0.0)
    assert solo["t"] is None and solo["rank"] == 0 and solo["file"] == "solo"


def test_a_rank_is_in_a_job_by_any_launcher_s_environment():
    for env in ({"RANK": "0", "SLURM_JOB_ID": "77", "WORLD_SIZE": "1"}, {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"},
                {"PMI_RANK": "0", "PMI_SIZE": "1"}, {"RANK": "0", "TORCHELASTIC_RUN_ID": "r7"},
                {"RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1"}):
        node = Node([P(5, 1), P(11, 5, env, gpu=0)])
        node.run(2)
        assert [p["rank"] for p in node.an.processes()] == [0], env


def test_two_ranks_missing_from_a_collective_are_both_named_in_one_sentence():
    env4 = [torchrun_env(r, 4) for r in range(4)]
    node = Node([P(10, 1), *(P(11 + r, 10, env4[r], gpu=r, log=f"/job/log{r}") for r in range(4))])
    node.run(5)
    coll = [("torch/distributed/distributed_c10d.py", "broadcast_object_list"), ("server.py", "loop")]
    event = [("threading.py", "wait"), ("server.py", "start")]
    for pid, frames in ((11, coll), (12, coll), (13, event), (14, event)):
        node.stack(pid, frames)
    node.run(15)
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [2, 3] and inc.culprit_pids == [13, 14]
    assert "rank 2 (pid 13), rank 3 (pid 14) are not in the collective their peers wait in" in inc.summary, inc.summary
    assert inc.evidence["ranks_from"] == {str(r): "environment RANK" for r in range(4)}


def test_dumps_of_processes_hangd_does_not_watch_are_judged_together_and_bad_ones_reported():
    from hangd.flightrec.reader import read_file
    from hangd.snapshot import FrDump, Snapshot

    NCCL_DUMPS = TRACES / "nccl_stall" / "files"
    an = Analyzer()
    snap = Snapshot(t=1000.0)
    for r in (0, 1):
        path = str(NCCL_DUMPS / f"nccl_trace_rank_{r}")
        snap.fr_dumps.append(FrDump(pid=None, rank=r, format="pickle", path=path, dump=read_file(path)))
    snap.fr_dumps.append(FrDump(pid=77, rank=2, format="pickle", path="/dumps/nccl_trace_rank_2",
                                error="truncated pickle"))
    an.step(snap)
    kinds = [(f["kind"], f.get("job"), f.get("missing_ranks")) for f in an.findings]
    assert ("missing_rank", f"fr:{NCCL_DUMPS}", [1]) in kinds, kinds
    bad = [f for f in an.findings if f["kind"] == "unreadable"]
    assert bad == [{"t": 1000.0, "kind": "unreadable", "pid": 77, "rank": 2,
                    "message": "/dumps/nccl_trace_rank_2: truncated pickle", "source": "file"}]


def test_a_culprit_without_a_stack_yet_is_named_as_inferred_and_its_source_given():
    env3 = [torchrun_env(r, 3) for r in range(3)]
    node = Node([P(10, 1), *(P(11 + r, 10, env3[r], gpu=r) for r in range(3))])
    node.run(5)
    coll = [("torch/distributed/distributed_c10d.py", "broadcast_object_list"), ("server.py", "loop")]
    node.stack(11, coll)
    node.stack(12, coll)
    node.run(15)
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [2]
    assert inc.evidence["culprit_from"] == "its peers wait for it in a collective"
    node.stack(13, [("threading.py", "wait"), ("server.py", "start")])
    node.run(3)
    assert inc.evidence["culprit_from"] == "its peers wait for it in a collective; its stack is elsewhere"


def test_the_flight_recorder_hint_is_given_only_when_no_rank_records():
    def next_step(env_extra: dict[str, str]) -> str:
        node = Node([P(10, 1), *(P(11 + r, 10, torchrun_env(r, 2, **(env_extra if r == 1 else {})), gpu=r)
                                 for r in range(2))])
        node.run(5)
        node.stack(11, [("torch/distributed/distributed_c10d.py", "broadcast_object_list"), ("server.py", "loop")])
        node.stack(12, [("threading.py", "wait"), ("server.py", "start")])
        node.run(15)
        (inc,) = node.an.incidents()
        return inc.next_step

    assert report.FR_HINT in next_step({})
    assert report.FR_HINT in next_step({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"})
    assert report.FR_HINT not in next_step({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})
    assert report.FR_HINT not in next_step({"TORCH_FR_BUFFER_SIZE": " 20 "})


def test_findings_kept_in_memory_are_bounded_and_what_was_dropped_counted():
    from hangd.snapshot import FrDump, Snapshot

    an = Analyzer(Thresholds(max_findings_in_memory=3))
    for k in range(5):
        snap = Snapshot(t=1000.0 + k)
        snap.fr_dumps.append(FrDump(pid=70 + k, rank=0, format="json", path=f"/d/{k}", error="not JSON"))
        an.step(snap)
    assert [f["pid"] for f in an.findings] == [72, 73, 74]
    assert an.forgotten()["findings"] == 2


def test_a_prefixed_traceback_s_last_line_is_its_exception_even_without_a_message():
    from hangd.analysis.nodeview import exception_lines

    text = ("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"train.py\", line 3, in <module>\n"
            "[rank1]: KeyboardInterrupt\nKeyboardInterrupt\nValueError: bad value\n")
    assert exception_lines(text) == ["[rank1]: KeyboardInterrupt", "ValueError: bad value"]


def test_a_deep_stack_is_summarized_from_its_innermost_frames():
    from hangd.analysis.stackcat import summarize
    from hangd.snapshot import Frame, StackSample, ThreadStack

    frames = [Frame(name=f"f{i}", filename="model.py", line=i) for i in range(20)]
    sample = StackSample(pid=1, threads=[ThreadStack(tid=1, name="MainThread", active=True, owns_gil=True, frames=frames)])
    assert len(summarize(sample)) == 8 and len(summarize(sample, 12)) == 12
    assert summarize(sample)[0].startswith("f0 ")


def _reading(util: float | None = 100, util_mem: float | None = 0, **gpm: float) -> GpuSample:
    return GpuSample(index=0, util_gpu=util, util_mem=util_mem, mem_used=GiB, mem_total=141 * GiB, power_mw=None,
                     gpm=dict(gpm))


# (reading, works, spins): where the lines between a spinning NCCL kernel (util 100%, SM ~18%,
# nothing else), real work and light token-by-token decoding sit, one reading at a time
GPU_READINGS = [
    (_reading(SM_UTIL=18.0, ANY_TENSOR_UTIL=0.0, DRAM_BW_UTIL=0.0, NVLINK_TOTAL_TX_PER_SEC=0.0), False, True),
    (_reading(SM_UTIL=18.0), False, True),  # GPM without the other metrics: none of them counts
    (_reading(util=90, SM_UTIL=18.0), False, True),  # util exactly at the spin line
    (_reading(util=89.9, SM_UTIL=18.0), False, False),
    (_reading(SM_UTIL=40.0), False, False),  # SM at the line: more than a resident kernel
    (_reading(SM_UTIL=39.9), False, True),
    (_reading(DRAM_BW_UTIL=0.0), False, True),  # GPM without SM: an SM share not shown is not work
    (_reading(SM_UTIL=18.0, ANY_TENSOR_UTIL=0.05), True, False),  # tensor at its line: matrix math, work
    (_reading(SM_UTIL=18.0, ANY_TENSOR_UTIL=0.049), False, True),  # a spinning kernel's noise (<= 0.016%)
    (_reading(SM_UTIL=18.0, DRAM_BW_UTIL=1.0), True, False),  # DRAM alone: work
    (_reading(SM_UTIL=18.0, NVLINK_TOTAL_TX_PER_SEC=20.0), True, False),  # NVLink TX alone
    (_reading(SM_UTIL=18.0, NVLINK_TOTAL_RX_PER_SEC=20.0), True, False),  # NVLink RX alone, no TX key
    (_reading(SM_UTIL=18.0, NVLINK_TOTAL_RX_PER_SEC=19.9), False, True),
    (_reading(SM_UTIL=18.0, NVLINK_TOTAL_TX_PER_SEC=10.0, NVLINK_TOTAL_RX_PER_SEC=10.0), True, False),
    (_reading(util=100, util_mem=3.0), True, False),  # no GPM: the memory controller's activity
    (_reading(util=100, util_mem=2.9), False, True),
    (_reading(util=100, util_mem=None), False, True),
    (_reading(util=None, util_mem=None), False, False),
]


def test_one_gpu_reading_at_a_time_work_spin_or_neither():
    from hangd.analysis.signals import _reading_spins, _reading_works

    th = Thresholds()
    got = [(_reading_works(g, th), _reading_spins(g, th)) for g, _, _ in GPU_READINGS]
    assert got == [(w, s) for _, w, s in GPU_READINGS]


def test_a_window_works_or_spins_when_half_its_readings_do():
    from hangd.analysis.signals import gpu_signals

    th = Thresholds()
    spin, idle, work = (_reading(SM_UTIL=18.0), _reading(util=0, SM_UTIL=0.0),
                        _reading(SM_UTIL=60.0, ANY_TENSOR_UTIL=50.0, DRAM_BW_UTIL=10.0, NVLINK_TOTAL_TX_PER_SEC=5.0,
                                 NVLINK_TOTAL_RX_PER_SEC=7.0))
    half = gpu_signals([spin, idle], th)
    assert half.spin_frac == 0.5 and half.spins(th) and not half.any_work() and not half.works(th)
    third = gpu_signals([spin, idle, idle], th)
    assert not third.spins(th)
    w = gpu_signals([work, idle], th)
    assert w.works(th) and w.any_work() and w.work_frac == 0.5
    assert (w.sm, w.tensor, w.dram, w.nvlink_mibs) == (30.0, 25.0, 5.0, 6.0)
    assert gpu_signals([work, idle, idle], th).any_work() and not gpu_signals([work, idle, idle], th).works(th)
    sparse = gpu_signals([_reading(SM_UTIL=10.0), _reading(SM_UTIL=30.0, ANY_TENSOR_UTIL=4.0)], th)
    assert (sparse.tensor, sparse.dram, sparse.nvlink_mibs) == (2.0, 0.0, 0.0)
