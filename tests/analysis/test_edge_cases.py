"""Where the recorded traces never sit on a line: each test here puts one reading on a line of
the analysis (a deep stack, a vanished thread, a log line cut by the tail, a dump that cannot be
read, a culprit that exits), and says what the operator then reads."""

from __future__ import annotations

import pytest

from hangd.analysis import report
from hangd.analysis.nodeview import exception_lines
from hangd.snapshot import Frame, GpuSample, Snapshot, StackSample, ThreadStack

from .builders import GiB, Node, P, torchrun_env

COLL = [("torch/distributed/distributed_c10d.py", "all_reduce"), ("train.py", "step")]
ELSEWHERE = [("threading.py", "wait"), ("train.py", "load")]


def _thread(tid: int | None, name: str | None, frames: int = 2) -> ThreadStack:
    return ThreadStack(tid=tid, name=name, active=False, owns_gil=False,
                       frames=[Frame(name=f"f{i}", filename="model.py", line=i) for i in range(frames)])


def _job(n: int = 2, **kw: object) -> Node:
    return Node([P(10, 1), *(P(11 + r, 10, torchrun_env(r, n), gpu=r, **kw) for r in range(n))])  # type: ignore[arg-type]


def test_a_stack_brief_shows_twelve_frames_and_names_the_threads_that_went_away():
    node = _job()
    node.run(1)
    first = [_thread(11, "MainThread", 20), _thread(900, "loader"), _thread(None, "pt_heartbeat"), _thread(901, None)]
    node.pending_stacks.append(StackSample(pid=11, threads=first))
    node.run(1)
    node.pending_stacks.append(StackSample(pid=11, threads=[_thread(11, "MainThread", 20)]))
    node.run(1)
    brief = report.stack_brief(node.an.view, node.an.tracks.get(11), 11)
    assert brief is not None
    assert len(brief["frames"]) == 12 and brief["frames"][0].startswith("f0 ")
    assert brief["threads"] == 1 and brief["captures"] == 2
    gone = brief["threads_gone"]
    assert [g.split(" seen at ")[0] for g in gone] == ["thread loader (tid 900)", "thread pt_heartbeat",
                                                       "thread thread (tid 901)"], gone
    assert all(" is gone at " in g for g in gone)


def test_a_stack_brief_without_lost_threads_says_nothing_of_them():
    node = _job()
    node.run(1)
    for _ in range(2):
        node.pending_stacks.append(StackSample(pid=11, threads=[_thread(11, "MainThread", 3)]))
        node.run(1)
    brief = report.stack_brief(node.an.view, node.an.tracks.get(11), 11)
    assert brief is not None and "threads_gone" not in brief and brief["unchanged_across_captures"] is True
    assert len(brief["frames"]) == 3


def test_a_rank_prefix_is_read_up_to_its_own_bracket():
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=0, log="/job/out"),
                 P(12, 10, torchrun_env(1, 2), gpu=1, log="/job/out")])
    node.write_log("/job/out", "starting\n")
    node.run(1)
    node.write_log("/job/out", "[rank1]: ValueError: bad shape [4096] vs [7168]\n")
    node.run(1)
    (job,) = node.an.job_defs.values()
    got = [(e["rank"], e["line"]) for e in report.exceptions(node.an.view, job, 0.0)]
    assert got == [(1, "[rank1]: ValueError: bad shape [4096] vs [7168]")]


def test_power_not_read_is_not_reported_as_zero_watts():
    node = _job()
    node.run(1)
    snap = Snapshot(t=node.t + 0.25)
    node.t += 0.25
    an = node.an
    an.step(snap)
    job = next(iter(an.job_defs.values()))
    an.view.gpus[0].append((node.t, GpuSample(index=0, util_gpu=0, util_mem=0, mem_used=GiB, mem_total=141 * GiB,
                                              power_mw=None)))
    ev = report.evidence(an.view, an.tracks, job, an.signals, 3.0)
    assert ev["gpus"]["0"]["power_w"] is None
    an.view.gpus[0].append((node.t, GpuSample(index=0, util_gpu=0, util_mem=0, mem_used=GiB, mem_total=141 * GiB,
                                              power_mw=124_500)))
    ev_on = report.evidence(an.view, an.tracks, job, an.signals, 3.0)
    assert ev_on["gpus"]["0"]["power_w"] == 124.5


def test_an_exception_line_is_kept_whole_up_to_500_characters():
    long = "ValueError: " + "x" * 700
    assert exception_lines(long + "\n") == [long[:500]]


@pytest.mark.parametrize("before, appended, found", [
    ("step 1\n", "ValueError: one line appended\n", "ValueError: one line appended"),  # less than the tail
    ("a" * 5000, "b" * 10 + "\nRuntimeError: after a long line\n", "RuntimeError: after a long line"),  # a line longer than the tail, dropped
])
def test_a_log_line_is_read_whole_from_where_the_log_grew(before: str, appended: str, found: str):
    node = _job(log=None)
    node.procs[11].log = "/job/r0.log"
    node.write_log("/job/r0.log", before)
    node.run(1)
    node.write_log("/job/r0.log", appended)
    node.run(1)
    fs = node.an.view.files["/job/r0.log"]
    assert [line for _, line in fs.exceptions] == [found]


@pytest.mark.parametrize("rest, said", [
    ("", "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x2048 and 4096x1"),  # never came
    ("6)\n", "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x2048 and 4096x16)"),  # came late
])
def test_a_traceback_whose_last_line_lacks_its_newline_is_judged_once_as_of_when_it_was_written(rest: str, said: str):
    # a thread dies and its traceback's last bytes never reach the log (or come long after): the
    # exception is the job's probable cause from when its bytes were written, and counted once
    node = _job(log=None)
    node.procs[11].log = "/job/r0.log"
    node.write_log("/job/r0.log", "step 1\n")
    node.run(1)
    written = node.t + 0.25
    node.write_log("/job/r0.log", 'Traceback (most recent call last):\n  File "w.py", line 3, in work\n'
                                  "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x2048 and 4096x1")
    node.run(1)
    fs = node.an.view.files["/job/r0.log"]
    assert not fs.exceptions  # an unfinished line, for now
    node.run(node.an.th.log_unfinished_line_s + 1)
    assert [line for _, line in fs.exceptions] == ["RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x2048 and 4096x1"]
    if rest:
        node.write_log("/job/r0.log", rest)
        node.run(1)
    assert [(round(at or 0, 2), line) for at, line in fs.exceptions] == [(round(written, 2), said)]


def test_an_unfinished_traceback_is_judged_live_where_no_tail_comes_while_the_size_stands_still():
    # the live source sends a log's tail only when its size changed: the tail kept is judged
    from hangd.analysis.engine import Analyzer
    from hangd.snapshot import FileSample

    an = Analyzer()
    text = 'step 1\nTraceback (most recent call last):\n  File "w.py", line 3\nValueError: bad shape (4x1'
    an.step(Snapshot(t=1000.0, files=[FileSample(path="/j/r.log", size=7, tail="step 1\n")]))
    an.step(Snapshot(t=1000.5, files=[FileSample(path="/j/r.log", size=len(text), tail=text)]))
    for i in range(12):
        an.step(Snapshot(t=1001.0 + 0.25 * i, files=[FileSample(path="/j/r.log", size=len(text), tail=None)]))
    assert list(an.view.files["/j/r.log"].exceptions) == [(1000.5, "ValueError: bad shape (4x1")]


def test_an_unfinished_exception_already_there_when_first_read_stays_of_an_unknown_time():
    from hangd.analysis.engine import Analyzer
    from hangd.snapshot import FileSample

    an = Analyzer()
    text = "ValueError: old one (4x1"
    for i in range(12):
        an.step(Snapshot(t=1000.0 + 0.25 * i, files=[FileSample(path="/j/r.log", size=len(text), tail=text)]))
    done = text + "6)\nstep 2\n"
    an.step(Snapshot(t=1004.0, files=[FileSample(path="/j/r.log", size=len(done), tail=done)]))
    assert list(an.view.files["/j/r.log"].exceptions) == [(None, "ValueError: old one (4x16)")]


def test_an_exception_line_in_a_log_is_not_progress():
    from hangd.analysis.nodeview import classify_log_lines

    dying = 'Exception in thread w:\nTraceback (most recent call last):\n  File "w.py", line 3, in work\n' \
            "    x @ y\n    ~~^~~\nRuntimeError: shapes cannot be multiplied\n"
    assert classify_log_lines(dying) == (0, set())
    assert classify_log_lines("ValueError: bad\n") == (0, set())
    assert classify_log_lines("step 3 loss 0.5\n")[0] == len("step 3 loss 0.5\n")
    assert classify_log_lines(dying + "step 4\n")[0] == len("step 4\n")  # what follows the traceback counts


def test_a_log_read_first_gives_its_last_three_exceptions_as_already_there():
    node = _job(log=None)
    node.procs[11].log = "/job/r0.log"
    node.write_log("/job/r0.log", "".join(f"ValueError: number {i}\n" for i in range(5)))
    node.run(1)
    fs = node.an.view.files["/job/r0.log"]
    assert list(fs.exceptions) == [(None, "ValueError: number 2"), (None, "ValueError: number 3"),
                             (None, "ValueError: number 4")]


def test_two_unreadable_dumps_are_counted_twice():
    from hangd.snapshot import FrDump

    node = _job()
    node.run(1)
    snap = Snapshot(t=node.t + 0.25)
    snap.fr_dumps += [FrDump(pid=11, rank=0, format="pickle", path="/d/0", error="truncated pickle"),
                      FrDump(pid=12, rank=1, format="pickle", path="/d/1", error="truncated pickle")]
    node.an.step(snap)
    assert node.an.unreadable == 2


def test_a_stack_that_changed_between_two_captures_is_progress_at_the_first_one():
    node = _job()
    node.run(2)
    node.stack(11, COLL)
    node.tick()
    first = node.t
    node.run(1)
    node.stack(11, COLL)  # the same stack again: no progress
    node.tick()
    assert node.an.progress.of(11).why != "its stack changed between two captures"
    node.run(1)
    node.stack(11, ELSEWHERE)
    node.tick()
    p = node.an.progress.of(11)
    assert p.why == "its stack changed between two captures", p.why
    assert abs(p.last_strong - (first + 1.26)) < 1e-6  # the capture before the change, plus 10 ms


def test_a_known_verdict_outlives_an_unknown_capture_for_half_a_window():
    node = _job()
    node.run(2)
    node.stack(11, COLL)
    node.tick()
    known = node.an.tracks[11].verdict
    assert known.kind == "collective"
    half = node.an.th.window_s / 2
    for _ in range(int(half * node.hz) - 1):
        node.tick()
    node.stack(11, [("mystery.py", "spin")])  # a stack no rule knows, exactly half a window later
    node.tick()
    assert node.an.tracks[11].verdict.kind == "collective"
    node.tick()
    node.stack(11, [("mystery.py", "spin")])  # and once more, just past it: replaced
    node.tick()
    assert node.an.tracks[11].verdict.kind != "collective"


def test_the_thread_that_says_what_a_process_does_is_not_a_watchdog():
    from hangd.analysis.stackcat import summarize

    watchdog = ThreadStack(tid=5, name=None, active=False, owns_gil=False,
                           frames=[Frame(name="c10d::ProcessGroupNCCL::Watchdog::run", filename="libtorch.so")])
    worker = ThreadStack(tid=6, name=None, active=True, owns_gil=True, frames=[Frame(name="forward", filename="model.py", line=9)])
    assert summarize(StackSample(pid=1, threads=[watchdog, worker])) == ["forward (model.py:9)"]
    assert summarize(StackSample(pid=1, threads=[watchdog])) == ["c10d::ProcessGroupNCCL::Watchdog::run (libtorch.so)"]


def test_a_rank_without_a_gpu_is_one_by_its_launcher_s_environment_alone():
    for env, rank in (({"RANK": "0", "TORCHELASTIC_RUN_ID": "r7"}, True), ({"RANK": "0", "SLURM_JOB_ID": "77"}, True),
                      ({"RANK": "0", "PMI_SIZE": "2"}, True), ({"RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, True),
                      ({"RANK": "0"}, False), ({"RANK": "0", "WORLD_SIZE": "2"}, False)):
        node = Node([P(5, 1), P(11, 5, env)])
        node.run(2)
        assert ([p["pid"] for p in node.an.processes()] == [11]) is rank, env


def _stopped_then_killed() -> Node:
    node = Node([P(10, 1), *(P(11 + r, 10, torchrun_env(r, 3), gpu=r) for r in range(3))])
    node.run(3)
    node.procs[13].state = "T"  # rank 2 stopped (SIGSTOP, a debugger); rank 1 never shows a stack
    node.stack(11, COLL)
    node.run(20)
    (inc,) = [i for i in node.an.incidents() if i.resolved_at is None]
    assert inc.culprit_ranks == [2] and inc.evidence["culprit_from"] == "stopped"
    node.kill(13)
    node.stack(11, COLL)
    node.run(15)
    return node


def test_a_stopped_culprit_that_is_then_killed_stays_the_culprit_and_no_bystander_is_blamed():
    hang = next(i for i in _stopped_then_killed().an.incidents() if i.kind == "host_stall")
    assert hang.culprit_ranks == [2] and hang.culprit_pids == [13]


def test_a_culprit_that_exited_is_said_to_have_exited():
    hang = next(i for i in _stopped_then_killed().an.incidents() if i.kind == "host_stall")
    assert "rank 2 (pid 13) is not in the collective its peers wait in: rank 2: exited at " in hang.summary, hang.summary


def _sigs(**kw: object):
    from hangd.analysis.signals import GpuSignals, ProcSignals

    s = ProcSignals(pid=1, age_s=60.0)
    s.gpu = GpuSignals()
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def _book():
    from hangd.analysis.progress import ProgressBook
    from hangd.analysis.thresholds import Thresholds

    return ProgressBook(Thresholds())


def test_work_seen_only_by_the_memory_controller_names_the_process_s_first_gpu_and_its_share():
    from hangd.analysis.signals import GpuSignals

    b = _book()
    b.observe(1, _sigs(gpu=GpuSignals(util=100, util_mem=7, work_frac=1.0), gpu_indexes=[2, 3], gpu_work_at=99.5), 100.0, None)
    assert b.of(1).why == "GPU 2 memory controller 7% busy" and b.of(1).last_strong == 99.5


def test_disk_io_of_a_rank_blocked_in_a_collective_is_not_its_progress():
    from hangd.analysis.thresholds import MiB

    for wait, credited in (("collective", False), ("store", False), ("lock_wait", False), ("sleep", True), (None, True)):
        b = _book()
        b.observe(1, _sigs(read_per_s=50 * MiB), 100.0, wait)
        assert (b.of(1).last is not None) is credited, wait


def test_disk_io_just_under_the_line_is_not_progress_whatever_was_not_read():
    from hangd.analysis.thresholds import MiB

    b = _book()
    b.observe(1, _sigs(read_per_s=1 * MiB - 0.5, write_per_s=None), 100.0, None)
    assert b.of(1).last is None
    b.observe(1, _sigs(read_per_s=1 * MiB, write_per_s=None), 101.0, None)
    assert b.of(1).last == 101.0


def test_a_slow_reader_s_bytes_count_once_it_read_in_two_distinct_seconds():
    from hangd.analysis.thresholds import MiB

    for active, credited in ((1, False), (2, True)):
        b = _book()
        b.observe(1, _sigs(io_long_per_s=2_500_000.4, io_active_s=active, io_last_at=98.0), 100.0, None)
        assert (b.of(1).last_strong == 98.0) is credited, active
        if credited:
            assert b.of(1).why == "disk I/O 3 MB/s over the last 6 s", b.of(1).why
    assert MiB > 1_000_000


def test_bytes_read_are_credited_when_they_last_moved_not_at_each_tick_after():
    # rank 1 of matrix-cpu/mpargv-load_disk-thread_dies-sleep_loop at 11.06 s: its loader thread died
    # and its last bytes came in at 9.55 s; the 2 s and 6 s rates still carry them. Its peer, waiting
    # since 10.5 s, must not see it progress after its wait began.
    b = _book()
    b.observe(1, _sigs(read_per_s=55.4e6, io_long_per_s=266e6, io_active_s=5, io_last_at=9.55, in_long_per_s=248e6,
                       in_active_s=5, in_counter="read_bytes", in_quiet_s=1.76), 11.06, None)
    assert b.of(1).last == 9.55 and b.of(1).last_strong == 9.55


def _compile_node(workers: list[tuple[int, int]]) -> Node:
    """A rank (pid 11) with compile workers below it: (pid, CPU ticks a second) each."""
    procs = [P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0)]
    for pid, ticks in workers:
        procs.append(P(pid, 11, cmdline=["python", "-m", "torch._inductor.compile_worker", "--workers=2"],
                       cpu_ticks_per_s=ticks))
    return Node(procs)


def test_only_busy_compile_workers_are_counted_under_their_rank():
    node = _compile_node([(21, 5), (22, 100), (23, 50)])  # 0.05 cores (an idle pool), 1 core, 0.5 cores
    node.run(2)
    assert node.an.view.compile_children.get(11) == 2
    assert node.an.view.compile_children.get(10) == 2  # and under the launcher above it
    node = _compile_node([(21, 5)])
    node.run(2)
    assert node.an.view.compile_children.get(11) is None


def test_a_log_is_the_progress_of_a_process_without_io_counters_when_it_alone_writes_it():
    from hangd.analysis.nodeview import ProcHistory
    from hangd.analysis.signals import _wrote_in
    from hangd.snapshot import ProcSample

    h = ProcHistory(pid=1, first_seen=0.0)
    for k in range(4):
        h.samples.append((float(k), ProcSample(pid=1, io=None)))
    assert _wrote_in(h, 3.0, 2.0) is None
    h.samples.append((4.0, ProcSample(pid=1, io={"wchar": 10})))
    h.samples.append((5.0, ProcSample(pid=1, io={"wchar": 10})))
    assert _wrote_in(h, 5.0, 2.0) is False
    h.samples.append((6.0, ProcSample(pid=1, io={"wchar": 30})))
    assert _wrote_in(h, 6.0, 2.0) is True


def test_a_hung_job_whose_launcher_died_is_hung_while_its_ranks_are_orphaned():
    node = _job(3)
    node.run(3)
    node.stack(11, COLL)
    node.stack(12, COLL)
    node.run(20)
    assert node.jobs()[0]["state"] == "hung"
    node.kill(10)  # the launcher goes; its ranks, still holding their GPUs, are re-parented to init
    for p in (11, 12, 13):
        node.procs[p].ppid = 1
    node.run(20)
    assert {p["state"] for p in node.an.processes()} == {"orphaned"}
    assert sorted(str(i.kind) for i in node.an.incidents() if i.resolved_at is None) == ["host_stall", "orphaned_gpu_memory"]
    assert node.jobs()[0]["state"] == "hung"


def test_a_dump_s_own_rank_wins_over_the_rank_in_its_file_name():
    from hangd.flightrec.reader import read_file
    from hangd.snapshot import FrDump

    from ..conftest import TRACES

    node = _job()
    node.run(1)
    snap = Snapshot(t=node.t + 0.25)
    for r in (0, 1):
        path = str(TRACES / "nccl_stall" / "files" / f"nccl_trace_rank_{r}")
        snap.fr_dumps.append(FrDump(pid=11 + r, rank=7 - r, format="pickle", path=path, dump=read_file(path)))
    node.an.step(snap)
    (tr,) = [tr for tr in node.an.job_tracks.values() if tr.fr]
    assert sorted(tr.fr) == [0, 1] and tr.fr_pids == {0: 11, 1: 12}


def test_a_dump_of_a_job_that_still_progresses_does_not_say_a_rank_is_missing_or_stuck():
    from hangd.analysis import frjobs
    from hangd.analysis.views import JobTrack
    from hangd.flightrec.analyze import Finding

    node = _job(look="work")
    node.run(3)
    (job_id,) = node.an.job_defs
    tr = JobTrack()
    for kind in ("missing_rank", "stuck", "size_mismatch"):
        frjobs.fr_finding(node.an.env, node.an.flight, node.an.job_defs, job_id, tr, Finding(kind=kind, pg="0", seq=3, op="all_reduce", ranks=[0, 1], message=kind,
                                                   sizes={0: [[4]], 1: [[8]]}), node.t)
    assert [f.kind for f in tr.findings] == ["size_mismatch"]


def _feed(view, t: float, samples: list, gpus: list | None = None, infos: list | None = None, files: list | None = None):
    snap = Snapshot(t=t)
    snap.procs, snap.gpus, snap.infos, snap.files = samples, gpus or [], infos or [], files or []
    view.feed(snap)


def _gpu(idx: int, procs: dict[int, int], util: float = 0, **gpm: float) -> GpuSample:
    from hangd.snapshot import GpuProc

    return GpuSample(index=idx, util_gpu=util, util_mem=0, mem_used=sum(procs.values()), mem_total=141 * GiB,
                     power_mw=100_000, gpm=dict(gpm), procs=[GpuProc(pid=p, used=u) for p, u in procs.items()])


def test_io_counters_that_appear_mid_window_give_no_rate_and_no_error():
    from hangd.analysis.nodeview import NodeView
    from hangd.analysis.signals import proc_signals
    from hangd.analysis.thresholds import Thresholds
    from hangd.snapshot import ProcSample

    th = Thresholds()
    view = NodeView(th)
    _feed(view, 100.0, [ProcSample(pid=7, ppid=1, state="S", io=None)])
    _feed(view, 101.0, [ProcSample(pid=7, ppid=1, state="S", io={"read_bytes": 10**9, "wchar": 5})])
    s = proc_signals(view, 7, 101.0, th)
    assert s.read_per_s is None and s.io_long_per_s is None


def test_a_process_on_two_gpus_is_read_on_the_one_it_holds_most_memory_on():
    from hangd.analysis.nodeview import NodeView
    from hangd.analysis.signals import proc_signals
    from hangd.analysis.thresholds import Thresholds
    from hangd.snapshot import ProcSample

    from .builders import IDLE, WORK

    th = Thresholds()
    view = NodeView(th)
    for k in range(9):
        _feed(view, 100.0 + k / 4, [ProcSample(pid=7, ppid=1, state="S")],
              [_gpu(0, {7: GiB // 2}, 0, **IDLE), _gpu(1, {7: 20 * GiB}, 99, **WORK)])
    s = proc_signals(view, 7, 102.0, th)
    assert s.gpu_indexes == [0, 1] and s.gpu.works(th) and s.gpu_work_at == 102.0


def test_gpu_memory_that_grows_inside_the_first_window_is_its_change():
    from hangd.analysis.nodeview import NodeView
    from hangd.analysis.signals import proc_signals
    from hangd.analysis.thresholds import Thresholds
    from hangd.snapshot import ProcSample

    th = Thresholds()
    view = NodeView(th)
    for k in range(5):
        _feed(view, 100.0 + k / 4, [ProcSample(pid=7, ppid=1, state="S")], [_gpu(0, {7: (2 + k) * GiB})])
    s = proc_signals(view, 7, 101.0, th)
    assert s.gpu_mem_change == 4 * GiB and s.gpu_mem_rate == 4 * GiB / th.window_s


def test_on_a_shared_gpu_a_process_without_sm_time_keeps_only_the_gpu_s_power_and_kind_of_reading():
    from hangd.analysis.nodeview import NodeView
    from hangd.analysis.signals import proc_signals
    from hangd.analysis.thresholds import Thresholds
    from hangd.snapshot import ProcSample

    from .builders import WORK

    th = Thresholds()
    view = NodeView(th)
    for k in range(9):
        g = _gpu(0, {7: 20 * GiB, 8: GiB}, 99, **WORK)
        g.proc_util = [{"pid": 7, "sm": 80}, {"pid": 8, "sm": 0}]
        _feed(view, 100.0 + k / 4, [ProcSample(pid=7, ppid=1, state="R"), ProcSample(pid=8, ppid=1, state="S")], [g])
    s = proc_signals(view, 8, 102.0, th)
    assert s.gpu_shared_idle and s.gpu.util == 0.0 and s.gpu.has_gpm is True and s.gpu.power_w == 100.0
    assert s.gpu_work_at is None and not s.gpu.any_work()


def test_a_log_grown_by_a_process_without_io_counters_is_its_own_when_it_alone_writes_it():
    from hangd.analysis.nodeview import NodeView
    from hangd.analysis.signals import proc_signals
    from hangd.analysis.thresholds import Thresholds
    from hangd.snapshot import FileSample, ProcInfo, ProcSample

    th = Thresholds()
    for writers, mine in ((1, True), (2, False)):
        view = NodeView(th)
        infos = [ProcInfo(pid=p, ppid=1, cmdline=["python", "x.py"], fds={"1": "/l/out"}) for p in range(7, 7 + writers)]
        for k in range(8):
            _feed(view, 100.0 + k / 4, [ProcSample(pid=p, ppid=1, state="S", io=None) for p in range(7, 7 + writers)],
                  infos=infos if k == 0 else None, files=[FileSample(path="/l/out", size=10 * (k + 1),
                                                                    tail="".join(f"step {i}\n" for i in range(k + 1)))])
        s = proc_signals(view, 7, 101.75, th)
        assert (s.log_grew_at == 101.75) is mine and (s.log_grew_shared_at == 101.75) is not mine, writers


def test_a_slow_writer_s_bytes_count_like_a_slow_reader_s():
    from hangd.analysis.nodeview import NodeView
    from hangd.analysis.signals import proc_signals
    from hangd.analysis.thresholds import MiB, Thresholds
    from hangd.snapshot import ProcSample

    th = Thresholds()
    view = NodeView(th)
    for k in range(25):
        _feed(view, 100.0 + k / 4, [ProcSample(pid=7, ppid=1, state="S",
                                               io={"read_bytes": 0, "write_bytes": 2 * MiB * k, "rchar": 0, "wchar": 0})])
    s = proc_signals(view, 7, 106.0, th)
    assert s.io_long_per_s is not None and abs(s.io_long_per_s - 8 * MiB) < 1 and s.io_active_s >= 5


def test_main_thread_wake_ups_are_counted_only_over_half_a_window_or_more():
    from hangd.analysis.nodeview import NodeView
    from hangd.analysis.signals import proc_signals
    from hangd.analysis.thresholds import Thresholds
    from hangd.snapshot import ProcSample

    th = Thresholds()
    for n, counted in ((8, True), (7, True), (6, False)):  # half the 3 s window: 1.5 s, 7 readings
        view = NodeView(th)
        # n readings 0.25 s apart: the first counts from 1000 s, the last (n-1)/4 s later
        for k in range(n):
            _feed(view, 1000.0 + k / 4, [ProcSample(pid=7, ppid=1, state="S", voluntary_ctxt_switches=100 * k)])
        s = proc_signals(view, 7, 1000.0 + (n - 1) / 4, th)
        assert (s.wakes_per_s == 400.0) is counted, (n, s.wakes_per_s)


def test_compile_workers_under_a_parent_hangd_does_not_see_are_counted_for_it():
    from hangd.analysis.nodeview import NodeView
    from hangd.analysis.thresholds import Thresholds
    from hangd.snapshot import ProcSample

    view = NodeView(Thresholds())
    for k in range(3):
        _feed(view, 100.0 + k, [ProcSample(pid=30, ppid=500, comm="ptxas", state="R", utime=100 * k, stime=0)])
    assert view.compile_children == {500: 1}


def test_a_quiet_process_whose_stack_says_where_it_sleeps_is_no_longer_starting():
    for frames, starting in (([("time.py", "sleep"), ("server.py", "idle_loop")], False), (None, True)):
        node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0)])
        node.run(2)
        assert node.state(11) == "starting"
        if frames:
            node.stack(11, frames)
        node.run(1)
        assert node.an.tracks[11].started is not starting, frames  # (the new state then holds for its dwell)


def test_a_process_quiet_after_its_setup_is_no_longer_starting_at_setup_plus_quiet_time():
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), cpu_ticks_per_s=100)])  # imports, no GPU
    th = node.an.th
    node.run(th.startup_cpu_s + 5)
    assert node.state(11) == "starting"
    node.procs[11].cpu_ticks_per_s = 0
    while node.t < 999.0 + th.startup_cpu_s + th.startup_quiet_s - 0.25:  # the process started at 999 s
        node.tick()
        assert not node.an.tracks[11].started, node.t
    node.tick()
    assert node.an.tracks[11].started


def test_incidents_of_jobs_that_are_gone_end_even_after_one_kept_for_a_gpu():
    from hangd.incidents import IncidentKind

    node = _job()
    node.run(3)
    node.stack(11, COLL)
    node.run(20)
    node.an.book.open_incident(IncidentKind.ORPHANED_GPU_MEMORY, "gpu:0", node.t)
    node.an.book.open = {k: node.an.book.open[k] for k in sorted(node.an.book.open, key=lambda k: not k[0].startswith("gpu:"))}
    for p in (10, 11, 12):
        node.kill(p)
    node.run(2)
    hang = next(i for i in node.an.incidents() if i.kind == "host_stall")
    assert hang.resolved_at is not None


def test_a_rank_held_a_moment_for_a_stack_capture_is_still_described_by_its_stack():
    node = _job()
    node.run(3)
    node.stack(11, COLL)
    node.procs[11].state = "t"  # the capture held it in a tracing stop, at another kernel wait point
    node.procs[11].wchan = "ptrace_stop"
    node.tick()
    node.procs[11].state, node.procs[11].wchan = "S", "futex_do_wait"
    node.run(20)
    (inc,) = node.an.incidents()
    seen = []
    for state, wchan in (("t", "ptrace_stop"), ("S", "futex_do_wait"), ("t", "do_signal_stop")):
        node.procs[11].state, node.procs[11].wchan = state, wchan
        node.stack(12, ELSEWHERE)
        node.tick()
        seen.append(inc.summary)
    assert all("rank 0 has waited" in x and "its stack is inside a collective: all_reduce" in x for x in seen), seen
    assert inc.culprit_ranks == [1]


def test_a_rank_once_seen_waiting_in_the_hung_collective_is_never_made_a_suspect():
    node = _job(3)
    node.run(3)
    node.stack(11, COLL)
    node.stack(12, COLL)
    node.stack(13, ELSEWHERE)
    node.run(20)
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [2]
    node.procs[12].wchan = "ep_poll"  # rank 1 leaves the wait point its stack was taken at: its stack is stale
    node.run(5)
    assert inc.culprit_ranks == [2], inc.summary
    assert "rank 0 has waited" in inc.summary and "rank 1 has waited" in inc.summary, inc.summary


def test_a_gpu_child_of_a_rank_is_a_rank_only_on_a_gpu_of_its_own_with_more_than_a_context():
    for child_gpu, mem, rank in ((1, 20 * GiB, True), (0, 20 * GiB, False), (1, GiB // 2, False)):
        node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0), P(12, 11, {}, gpu=child_gpu, gpu_mem=mem,
                                                                         dist_threads=None)])
        node.run(2)
        assert (12 in {p["pid"] for p in node.an.processes() if p.get("rank") is not None}) is rank, (child_gpu, mem)
    # under a rank that holds no GPU itself (a CPU driver spawning its GPU workers)
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1)), P(12, 11, {}, gpu=1)])
    node.run(2)
    assert 12 in {p["pid"] for p in node.an.processes() if p.get("rank") is not None}


def test_what_counts_as_more_than_a_context_is_the_analyzer_s_setting():
    from hangd.analysis.engine import Analyzer
    from hangd.analysis.thresholds import Thresholds

    for line, rank in ((1.5 * GiB, True), (4 * GiB, False)):
        node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0), P(12, 11, {}, gpu=1, gpu_mem=2 * GiB)],
                    analyzer=Analyzer(Thresholds(started_gpu_mem_bytes=line)))
        node.run(2)
        assert (12 in {p["pid"] for p in node.an.processes() if p.get("rank") is not None}) is rank, line


def test_a_rank_known_only_by_local_rank_takes_it():
    node = Node([P(10, 1), P(11, 10, {"LOCAL_RANK": "3", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, gpu=0)])
    node.run(2)
    (p,) = node.an.processes()
    assert p["rank"] == 3
    (job,) = node.an.job_defs.values()
    assert job.rank_source[11] == "environment LOCAL_RANK"


def test_ranks_are_named_in_rank_order_whatever_their_pids():
    # pids in the opposite order of the ranks: rank 0 is pid 14, rank 3 is pid 11
    node = Node([P(10, 1), *(P(14 - r, 10, torchrun_env(r, 4), gpu=r) for r in range(4))])
    node.run(5)
    for r in (0, 1):
        node.stack(14 - r, COLL)
    for r in (2, 3):
        node.stack(14 - r, ELSEWHERE)
    node.run(15)
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [2, 3] and inc.culprit_pids == [12, 11]
    assert "rank 2 (pid 12), rank 3 (pid 11) are not in the collective their peers wait in" in inc.summary, inc.summary


def _straggling(n_waiting: int) -> Node:
    """Ranks 0..n_waiting-1 (pids in reverse order) wait in a collective for the last one, which sits
    idle on its GPU (a rank that works is doing its part, not holding them up)."""
    n = n_waiting + 1
    node = Node([P(10, 1), *(P(20 - r, 10, torchrun_env(r, n), gpu=r, look="work" if r == n - 1 else "spin")
                             for r in range(n))])
    node.run(3)
    node.procs[20 - n_waiting].look = "idle"
    for r in range(n_waiting):
        node.stack(20 - r, COLL)
    node.tick()
    return node


def test_a_straggler_s_reason_names_its_waiters_in_rank_order_in_good_english():
    for n_waiting, words in ((1, "rank 0 waits for it in a collective"), (2, "ranks 0, 1 wait for it in a collective")):
        node = _straggling(n_waiting)
        node.run(3)
        got = node.an.tracks[20 - n_waiting].reason
        assert got.startswith(words), (n_waiting, got)


def test_a_rank_reported_dead_or_a_zombie_has_exited_since_then():
    node = _job(3)
    node.run(3)
    node.procs[13].state = "Z"
    node.run(1)
    zombie_at = node.an.view.procs[13].zombie_since
    node.procs[12].state = "X"
    node.run(1)
    tr = next(iter(node.an.job_tracks.values()))
    assert set(tr.exited) == {12, 13} and tr.exited[13] == zombie_at


def test_a_process_quiet_from_its_start_is_no_longer_starting_after_the_quiet_time():
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0, start=1000.0)])
    quiet = node.an.th.startup_quiet_s
    node.run(quiet - 1)
    assert not node.an.tracks[11].started
    node.run(2)
    assert node.an.tracks[11].started
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0, start=1000.0, state="I", wchan="")])
    node.run(quiet + 1)
    assert node.an.tracks[11].started


def test_nothing_is_starting_past_the_longest_start_up():
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0, start=1000.0, state="R")])  # running, little CPU
    th = node.an.th
    node.run(th.startup_max_s - 1)
    assert not node.an.tracks[11].started
    node.run(2)
    assert node.an.tracks[11].started


def test_a_dump_that_arrives_after_its_rank_exited_goes_to_the_rank_s_job():
    from hangd.flightrec.reader import read_file
    from hangd.snapshot import FrDump

    from ..conftest import TRACES

    node = _job()
    node.run(3)
    (job_id,) = node.an.job_defs
    node.kill(12)
    node.run(1)
    path = str(TRACES / "nccl_stall" / "files" / "nccl_trace_rank_1")
    snap = Snapshot(t=node.t + 0.25)
    snap.fr_dumps.append(FrDump(pid=12, rank=1, format="pickle", path=path, dump=read_file(path)))
    node.an.step(snap)
    assert 1 in node.an.job_tracks[job_id].fr


def test_a_zombie_rank_whose_gpu_memory_nvml_still_lists_holds_it_as_an_orphan():
    node = _job()
    node.run(3)
    node.procs[12].state = "Z"  # exited, not reaped, and NVML still lists its 20 GiB on GPU 1
    node.run(node.an.th.orphan_gpu_s + 2)
    inc = next(i for i in node.an.incidents() if i.kind == "orphaned_gpu_memory")
    assert inc.culprit_pids == [12] and inc.culprit_ranks == [1] and "20.0 GiB" in inc.summary, inc.summary


def _verdict(kind: str):
    from hangd.analysis.stackcat import Verdict

    return Verdict(kind, kind.replace("_", " "), "f (x.py:1)", "MainThread", 50)


def _classified(verdict: str | None = None, recent: bool = False, **kw: object):
    from hangd.analysis.facts import Context
    from hangd.analysis.rankstate import classify
    from hangd.analysis.thresholds import Thresholds

    s = _sigs(**{"state": "S", "gpu_indexes": [0], "gpu_mem": GiB, **kw})
    ctx = Context(verdict=_verdict(verdict), progressed_recently=recent, progress_why="it wrote to its log") if verdict \
        else Context(progressed_recently=recent, progress_why="it wrote to its log")
    return classify(s, ctx, Thresholds())


def test_one_process_at_a_time_on_each_line_of_the_classifier():
    from hangd.analysis.signals import GpuSignals
    from hangd.analysis.thresholds import MiB

    growing = {"gpu_mem_rate": 300 * MiB, "gpu_mem_rate_before": 300 * MiB}
    cases = [  # (signals, verdict, local, why)
        ({"state": "Z"}, None, "zombie", "zombie: exited, not yet reaped"),
        ({}, "graph_capture", "graph_capture", "its stack is capturing a CUDA graph (f (x.py:1))"),
        ({}, "loading", "loading", "its stack is loading (f (x.py:1))"),
        ({"read_per_s": 130_500_000.4, "gpu_mem_rate": 1.0}, None, "loading", "reading 131 MB/s from disk, GPU memory growing 0 MB/s"),
        # a young slow reader that the CPU shows is not importing (CPU unknown)
        ({"in_long_per_s": 30 * MiB, "in_active_s": 3, "in_counter": "read_bytes", "age_s": 5.0}, None, "loading",
         "reading 31 MB/s from disk over the last 6 s"),
        # bytes going out are no reading, whatever the total
        ({"out_long_per_s": 30 * MiB, "out_active_s": 3, "out_counter": "write_bytes", "age_s": 60.0}, None,
         "quiet", "sleeping (state S); GPU idle, 1.0 GiB held"),
        # GPU memory growing while the GPU runs: capture, unless util and SM are both at their saturation lines
        ({"gpu": GpuSignals(util=98, sm=74.9), **growing}, None, "graph_capture",
         "GPU memory growing 315 MB/s while the GPU runs short bursts (util 98%, SM 75%)"),
        ({"gpu": GpuSignals(util=98, sm=75, work_frac=1.0), **growing}, None, "busy",
         "GPU working: util 98%, memory controller 0%"),
        ({"gpu": GpuSignals(util=97.9, sm=99), **growing}, None, "graph_capture",
         "GPU memory growing 315 MB/s while the GPU runs short bursts (util 98%, SM 99%)"),
        ({"gpu": GpuSignals(util=100, util_mem=0, spin_frac=1.0)}, None, "spinning",
         "spinning on the GPU: util 100% with the memory controller idle"),
        ({"log_kinds": {"compiling"}}, None, "compiling", "its log says it compiles"),
        ({"gpu_indexes": [], "gpu_mem": 0, "cpu_cores": None}, None, "quiet", "sleeping (state S)"),
    ]
    for kw, verdict, local, why in cases:
        rd = _classified(verdict, recent=True, **kw)
        assert (str(rd.local), rd.why) == (local, why), kw


def test_two_ranks_that_exit_together_are_one_incident_naming_them_in_rank_order_and_the_cause():
    # four ranks, pids in the opposite order of the ranks; each writes a log of its own
    node = Node([P(10, 1), *(P(14 - r, 10, torchrun_env(r, 4), gpu=r, log=f"/job/r{r}.log") for r in range(4))])
    node.write_log("/job/r3.log", "ValueError: an old error, long before\n")
    node.write_log("/job/r2.log", "loading shards\n")
    node.run(3)
    node.write_log("/job/r2.log", "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x4096 and 7168x4096)\n")
    node.run(1)
    node.kill(11)  # rank 3
    node.kill(12)  # rank 2
    node.run(node.an.th.rank_exit_grace_s + 15)
    (inc,) = [i for i in node.an.incidents() if i.kind == "rank_exited"]
    assert inc.culprit_ranks == [2, 3] and inc.culprit_pids == [12, 11]
    assert inc.summary.startswith("Probable cause, from rank 2's log (r2.log) at "), inc.summary
    assert "rank 2, 3 exited " in inc.summary and "while rank 0 (pid 14), rank 1 (pid 13) still run and have not" \
        in inc.summary, inc.summary
    assert [e["line"] for e in inc.evidence["exceptions"]] == [
        "ValueError: an old error, long before",  # in the log when first read: it may be the cause too
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x4096 and 7168x4096)"]
    for p in (13, 14):
        node.kill(p)
    node.run(2)
    assert inc.resolved_at is not None and inc.timeline[-1]["note"] == "the job's processes are gone"


def test_an_exception_older_than_the_lookback_is_not_the_cause_of_an_exit():
    from hangd.analysis.engine import Analyzer
    from hangd.analysis.thresholds import Thresholds

    node = Node([P(10, 1), *(P(11 + r, 10, torchrun_env(r, 2), gpu=r, log=f"/job/r{r}.log") for r in range(2))],
                analyzer=Analyzer(Thresholds(exception_lookback_s=5.0)))
    node.write_log("/job/r1.log", "step 1\n")
    node.run(2)
    node.write_log("/job/r1.log", "KeyError: 'old'\n")
    node.run(10)
    node.kill(12)
    node.run(node.an.th.rank_exit_grace_s + 5)
    (inc,) = [i for i in node.an.incidents() if i.kind == "rank_exited"]
    assert not inc.summary.startswith("Probable cause") and "exceptions" not in inc.evidence


def test_gpu_memory_no_visible_process_holds_is_an_incident_of_its_gpu_until_freed():
    from hangd.analysis.engine import Analyzer
    from hangd.snapshot import ProcSample

    an = Analyzer()
    th = an.th

    def tick(t: float, used: int) -> None:
        an.step(Snapshot(t=t, procs=[ProcSample(pid=5, ppid=1, state="S")],  # a process, but none on the GPUs
                         gpus=[_gpu(0, {}), GpuSample(index=1, util_gpu=0, util_mem=0, mem_used=used, mem_total=141 * GiB,
                                                      procs=[])]))

    tick(1000.0, 500 << 20)  # the driver's own 0.5 GiB: the GPU's baseline
    t = 1001.0
    while t < 1001.0 + th.unattributed_gpu_s:
        tick(t, 20 * GiB + (500 << 20))
        t += 1.0
    assert an.incidents() == []
    tick(t, 20 * GiB + (500 << 20))
    (inc,) = an.incidents()
    assert inc.job == "gpu:1" and inc.kind == "orphaned_gpu_memory"
    assert inc.summary == ("GPU 1 has 20.0 GiB in use that no visible process holds (used 20.5 GiB, processes 0.0 GiB): "
                           "a process in another PID namespace, or leaked memory. Check `nvidia-smi` on the host.")
    assert inc.evidence == {"gpu": 1, "mem_used": 20 * GiB + (500 << 20), "held_by_processes": 0}
    tick(t + 1, 20 * GiB + (500 << 20))
    assert len(an.incidents()) == 1
    tick(t + 2, 500 << 20)
    assert inc.resolved_at == t + 2


def test_a_gpu_s_readings_are_kept_to_a_bound_and_state_changes_counted_only_when_dropped():
    node = _job(look="work")
    node.run(2)
    assert node.changes and node.an.forgotten()["changes"] == 0
    from hangd.analysis.nodeview import NodeView
    from hangd.analysis.thresholds import Thresholds

    view = NodeView(Thresholds())
    for k in range(1300):
        _feed(view, 1000.0 + k / 4, [], [_gpu(0, {})])
    assert len(view.gpus[0]) == 1200


def test_a_state_nothing_shows_any_more_gives_way_to_the_most_frequent_new_one():
    # readings that flicker between new states (busy, quiet, a spin: a small model's steps over a
    # slow transport) never hold the dwell each; the old state must not stay for want of one that does
    from hangd.analysis.engine import Analyzer
    from hangd.analysis.identity import Job
    from hangd.analysis.model import State
    from hangd.analysis.signals import ProcSignals

    an = Analyzer()
    job = Job(id="j", name="j", ranks={7: 0})
    sig = ProcSignals(pid=7, age_s=30.0)
    assert an._set_state(7, job, State.LOADING, "reading", 1000.0, sig) is not None
    flicker = [State.BUSY, State.IDLE, State.BUSY, State.WAITING_PEER] * 6
    changes = [an._set_state(7, job, st, f"{st}", 1000.25 + 0.25 * i, sig) for i, st in enumerate(flicker)]
    said = [c for c in changes if c is not None]
    assert said and said[0].state == State.BUSY, said
    assert said[0].t - 1000.25 <= 2 * an.th.dwell_s + 0.5
    # a single blip inside the old state changes nothing
    an2 = Analyzer()
    an2._set_state(7, job, State.LOADING, "reading", 1000.0, sig)
    seq = [State.LOADING] * 5 + [State.BUSY] + [State.LOADING] * 20
    assert all(an2._set_state(7, job, st, "x", 1000.25 + 0.25 * i, sig) is None for i, st in enumerate(seq))


def _reason(node: Node, pid: int) -> str:
    return next(p["reason"] for p in node.an.processes() if p["pid"] == pid)


def test_a_rank_waiting_on_its_workers_names_each_with_what_it_does_and_is_busy_while_one_works():
    # rank 0 blocks on its DataLoader queue; of its three workers one decodes a batch on the CPU,
    # one sleeps on its pipe, one is runnable but gets no CPU
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0), P(21, 11, cpu_ticks_per_s=100, state="R", wchan="0"),
                 P(22, 11, wchan="pipe_read"), P(23, 11, state="R", wchan="0")])
    node.run(3)
    node.stack(11, [("torch/utils/data/dataloader.py", "_next_data"), ("train.py", "step")])
    node.run(3)
    reason = _reason(node, 11)
    assert node.state(11) == "busy", reason
    # the one that has not moved longest first, the working one last
    assert "its DataLoader workers pid 22 (sleeping in pipe_read for 6 s), pid 23 (state R), pid 21 (working)" in reason, reason
    assert reason.endswith("; they work: its workers pid 21 work"), reason


def test_of_many_workers_the_one_that_has_not_moved_is_named_first_whatever_its_pid():
    # four DataLoader workers; three keep decoding batches, the last one forked sleeps in its
    # __getitem__: the summary's first three must hold the one that has not moved
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0),
                 *(P(20 + i, 11, cpu_ticks_per_s=100, state="R", wchan="0") for i in range(1, 4)),
                 P(24, 11, wchan="futex_wait_queue")])
    node.run(3)
    node.stack(11, [("torch/utils/data/dataloader.py", "_next_data"), ("train.py", "step")])
    node.run(3)
    reason = _reason(node, 11)
    assert "its DataLoader workers pid 24 (sleeping in futex_wait_queue for 6 s), pid 21 (working)" in reason, reason
    assert "and 1 more" in reason, reason


def test_the_worker_blocked_longest_is_named_first_long_after_the_readings_kept():
    # two workers wake every second in their index-queue reads; the last one forked blocked in its
    # __getitem__ and never wakes: still the first named a minute on
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0),
                 P(21, 11, wchan="futex_wait_queue", vol_per_s=1), P(22, 11, wchan="futex_wait_queue", vol_per_s=1),
                 P(23, 11, wchan="futex_wait_queue")])
    node.run(3)
    node.stack(11, [("torch/utils/data/dataloader.py", "_next_data"), ("train.py", "step")])
    node.run(60)
    assert "its DataLoader workers pid 23 (sleeping in futex_wait_queue" in _reason(node, 11), _reason(node, 11)


@pytest.mark.parametrize("blocked_first", [True, False])
def test_a_worker_caught_running_has_moved_now_and_the_blocked_one_is_named_first(blocked_first):
    # an idle worker wakes from its 5 s queue read and is caught on the CPU: its switch count
    # changes only when it sleeps again, so its last switch says nothing of now; the worker
    # blocked in its __getitem__ is named first whether it was forked first or last
    blocked = P(21 if blocked_first else 22, 11, wchan="futex_wait_queue")
    idle = P(22 if blocked_first else 21, 11, state="R", wchan="0")
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0), *sorted([blocked, idle], key=lambda p: p.pid)])
    node.run(3)
    node.stack(11, [("torch/utils/data/dataloader.py", "_next_data"), ("train.py", "step")])
    node.run(4)
    reason = _reason(node, 11)
    assert f"its DataLoader workers pid {blocked.pid} (sleeping in futex_wait_queue" in reason, reason
    assert f"pid {idle.pid} (state R)" in reason, reason


def test_collectives_that_keep_completing_with_a_rank_that_polls_are_an_idle_server():
    # rank 0 sleeps between polls of an empty queue; rank 1 sits in the broadcast of each empty batch
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=0, wchan="hrtimer_nanosleep"),
                 P(12, 10, torchrun_env(1, 2), gpu=1, vol_per_s=20)])
    node.run(5)
    node.stack(12, COLL)
    node.run(10)
    assert node.state(12) == "idle", _reason(node, 12)
    assert _reason(node, 12).startswith("idle server: the collectives with rank 0 keep completing (20 a second) "
                                        "and no rank works; this rank: its stack is inside a collective"), _reason(node, 12)


@pytest.mark.parametrize(("kw", "set_up"), [
    ({"gpu": 0, "wchan": "hrtimer_nanosleep"}, True),  # its memory is in and it sleeps in a loop of its own
    ({"gpu": 0, "wchan": "hrtimer_nanosleep", "gpu_mem": 600 << 20}, False),  # a CUDA context alone
    ({"cpu_ticks_per_s": 100, "state": "R", "dist_threads": ["gloo"]}, True),  # no GPU, process group up
    ({"cpu_ticks_per_s": 100, "state": "R"}, False),  # no GPU, no process group yet: importing
])
def test_a_young_rank_is_set_up_at_once_by_its_memory_while_asleep_or_its_process_group_while_on_cpu(kw, set_up):
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), start=1000.0, **kw)])  # type: ignore[arg-type]
    node.run(3)
    assert node.an.tracks[11].started is set_up, _reason(node, 11)


def test_a_rank_that_exits_after_the_first_is_added_to_its_rank_exited_incident():
    node = Node([P(10, 1), *(P(11 + r, 10, torchrun_env(r, 3), gpu=r) for r in range(3))])
    grace = node.an.th.rank_exit_grace_s
    node.run(3)
    node.kill(12)  # rank 1
    node.run(grace + 5)
    (inc,) = node.an.incidents()
    assert inc.kind == "rank_exited" and inc.culprit_ranks == [1]
    node.kill(13)  # rank 2, later
    node.run(grace + 5)
    assert node.an.incidents() == [inc] and inc.culprit_ranks == [1, 2], inc.summary
    assert inc.summary.startswith("rank 1, 2 exited ") and "while rank 0 (pid 11) still runs" in inc.summary, inc.summary
    assert inc.timeline[-1]["note"] == "rank 2 exited"


def test_an_io_stall_with_no_rank_to_blame_says_how_long_nothing_has_progressed():
    node = _job(state="D", wchan="nfs_wait_on_request")  # both ranks in uninterruptible I/O from the start
    node.run(node.an.th.hang_io_s + 5)
    (inc,) = node.an.incidents()
    assert inc.kind == "io_stall" and inc.culprit_ranks == [], inc.summary
    assert "no rank has progressed for " in inc.summary, inc.summary


def _capture(node: Node, pid: int, frames: list[tuple[str, str, int]]) -> None:
    node.pending_stacks.append(StackSample(pid=pid, threads=[ThreadStack(
        tid=pid, name="MainThread", active=True, owns_gil=True,
        frames=[Frame(name=n, filename=f, line=ln) for f, n, ln in frames])]))


@pytest.mark.parametrize(("second", "moved"), [
    ([("ckpt.py", "spin", 41), ("ckpt.py", "save", 12), ("train.py", "main", 3)], False),  # the loop's other line
    ([("ckpt.py", "write_shard", 7), ("ckpt.py", "save", 14), ("train.py", "main", 3)], True),  # a new call
])
def test_a_stack_moved_only_when_its_calls_differ_not_the_line_of_a_loop(second, moved):
    """A rank spinning in one Python function shows a new line at each capture and goes nowhere:
    that is no progress, and its peer's wait becomes a hang naming it. A capture in another call is."""
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), state="R", wchan="0", cpu_ticks_per_s=100),
                 P(12, 10, torchrun_env(1, 2))])
    node.run(2)
    node.stack(12, COLL)
    _capture(node, 11, [("ckpt.py", "spin", 40), ("ckpt.py", "save", 12), ("train.py", "main", 3)])
    node.run(4)
    _capture(node, 11, second)
    node.run(1)
    said = node.an.progress.of(11).why == "its stack changed between two captures"
    assert said == moved, node.an.progress.of(11).why
    node.run(30)
    hangs = [i for i in node.an.incidents() if i.kind == "host_stall"]
    if not moved:
        assert len(hangs) == 1 and hangs[0].culprit_ranks == [0], [(i.kind, i.culprit_ranks) for i in node.an.incidents()]


def test_a_worker_that_worked_then_stopped_is_said_still_since_it_stopped():
    # its DataLoader worker decoded batches for 4 s, then blocked in its __getitem__: "for N s"
    # counts from when its CPU time last moved, not from the first reading kept
    worker = P(21, 11, cpu_ticks_per_s=100, state="R", wchan="0")
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0), worker])
    node.run(4)
    worker.cpu_ticks_per_s, worker.state, worker.wchan = 0, "S", "futex_wait_queue"
    node.run(3)
    node.stack(11, [("torch/utils/data/dataloader.py", "_next_data"), ("train.py", "step")])
    node.run(3)
    reason = _reason(node, 11)
    assert "its DataLoader worker pid 21 (sleeping in futex_wait_queue for 6 s)" in reason, reason
