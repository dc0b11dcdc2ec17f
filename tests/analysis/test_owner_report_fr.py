"""What an operator reads of a job's owner, of the threads a rank lost, and of its flight recorder:
whom to page, which threads went away between captures, when a rank's collectives last completed,
and the flight-recorder findings attached to the job's incident."""

from __future__ import annotations

from dataclasses import replace

from hangd.analysis import frjobs, owner, report
from hangd.analysis.detectors import Env
from hangd.analysis.nodeview import NodeView
from hangd.analysis.progress import ProgressBook
from hangd.analysis.thresholds import Thresholds
from hangd.analysis.views import JobTrack
from hangd.flightrec.analyze import Finding
from hangd.flightrec.reader import Dump, Entry
from hangd.incidents import IncidentBook
from hangd.snapshot import FrDump, StackSample, ThreadStack

from .builders import Node, P, torchrun_env

SLURM = {"job_id": "1234", "name": "train-llama"}
UID = "0f3c9a52-7e0b-4d3e-9a1b-2c4d5e6f7a8b"


def _env(**th: object) -> Env:
    t = replace(Thresholds(), **th)
    return Env(th=t, view=NodeView(t), tracks={}, progress=ProgressBook(t), book=IncidentBook())


def _job() -> Node:
    return Node([P(10, 1), *(P(11 + r, 10, torchrun_env(r, 2), gpu=r) for r in range(2))])


def _dump(rank: int, done: int, statuses: bool = True, timed: bool = True) -> Dump:
    """A rank's dump: all_reduce #1..#done completed, #done+1 in flight; ``timed`` False for a
    recorder that stamps no times; ``statuses`` False for one with no process group yet."""
    entries = [Entry(record_id=s - 1, pg="0", pg_id=0, seq=s, p2p_seq=0, op="nccl:all_reduce",
                     state="completed" if s <= done else "scheduled", completed=s <= done, input_sizes=[[1024]],
                     input_dtypes=["Float"], output_sizes=[[1024]], is_p2p=False, frames=[],
                     time_created_ns=int((900 + s) * 1e9) if timed else None, timeout_ms=None)
               for s in range(1, done + 2)] if statuses else []
    return Dump(rank=rank, version="2.10", encoding="pickle",
                pg_status={"0": {"last_enqueued_collective": done + 1, "last_completed_collective": done}}
                if statuses else {}, entries=entries)


def _rank0(node: Node) -> dict:
    return next(p for p in node.an.processes() if p["pid"] == 11)


# ------------------------------------------------------------------ owner.describe


def test_the_slurm_step_is_named_with_its_job():
    # the operator would page about job 1234 without knowing which step (or read a crash)
    assert owner.describe({"slurm": {**SLURM, "step_id": "2"}}) == "Slurm job 1234.2 (train-llama)"


def test_a_job_without_a_step_is_named_by_its_id_alone():
    # the job id would be garbled with text that is no part of it
    assert owner.describe({"user": "alice", "slurm": SLURM}) == "owner alice, Slurm job 1234 (train-llama)"


def test_an_array_task_is_named_with_its_array():
    # the operator would not learn which array task hangs (or read a crash)
    w = {"slurm": {**SLURM, "array_job_id": "1200", "array_task_id": "7"}}
    assert owner.describe(w) == "Slurm job 1234 (train-llama, array 1200_7)"


def test_a_pod_without_a_namespace_is_named_without_one():
    # a pod with no namespace read would crash the description instead of naming it
    assert owner.describe({"pod": {"uid": UID, "name": "train-0"}}) == "pod train-0"


def test_a_pod_whose_name_was_not_found_says_why():
    # the operator would read "not resolved" instead of the reason the name is unknown
    w = {"pod": {"uid": UID, "unresolved": "kubelet not reachable"}}
    assert owner.describe(w) == f"pod uid {UID}, name unknown: kubelet not reachable"


# ------------------------------------------------------------------ report.threads_gone


def _cap(*names: str) -> list[StackSample]:
    return [StackSample(pid=11, threads=[ThreadStack(tid=100 + i, name=n, active=False, owns_gil=False, frames=[])
                                         for i, n in enumerate(names)])]


def test_threads_lost_at_any_earlier_capture_are_named_against_the_newest():
    # a thread lost between the second and third capture (or the first one's) would go unreported
    gone = report.threads_gone([(1000.0, _cap("MainThread", "loader")), (1001.0, _cap("MainThread", "heartbeat")),
                                (1002.0, _cap("MainThread"))])
    assert [g.split(" seen at ")[0] for g in gone] == ["thread loader (tid 101)", "thread heartbeat (tid 101)"]
    assert all(g.endswith(f"is gone at {report.clock(1002.0)}") for g in gone), gone


# ------------------------------------------------------------------ frjobs


def test_collectives_completed_between_dumps_are_progress_after_the_earlier_dump():
    # a rank would be shown progressing before the dump that showed it had not yet completed them
    node = _job()
    node.run(1)
    node.pending_fr = [FrDump(pid=11, rank=0, format="pickle", path="/fr/rank_0", dump=_dump(0, 3, timed=False))]
    node.run(0.25)
    first = node.t
    node.run(2)
    node.pending_fr = [FrDump(pid=11, rank=0, format="pickle", path="/fr/rank_0", dump=_dump(0, 5, timed=False))]
    node.run(0.25)
    p = _rank0(node)
    assert p["last_progress_why"] == "flight recorder: completed collectives 3 -> 5"
    assert first < p["last_progress"] < node.t


def test_a_first_collective_after_a_dump_without_groups_is_progress():
    # a rank that completed its first collective would not be credited with progress
    node = _job()
    node.run(1)
    node.pending_fr = [FrDump(pid=11, rank=0, format="pickle", path="/fr/rank_0", dump=_dump(0, 0, statuses=False))]
    node.run(0.25)
    node.pending_fr = [FrDump(pid=11, rank=0, format="pickle", path="/fr/rank_0", dump=_dump(0, 1))]
    node.run(0.25)
    assert _rank0(node)["last_progress_why"] == "flight recorder: completed collectives 0 -> 1"


def _missing(seq: int) -> Finding:
    return Finding(kind="missing_rank", pg="0", seq=seq, op="all_reduce", ranks=[0], missing_ranks=[1],
                   message=f"rank 1 never entered all_reduce #{seq}")


def test_a_rank_exited_incident_carries_the_flight_recorder_findings_in_its_evidence():
    # the operator would not see in the incident what the flight recorder found
    env, fl, tr = _env(), frjobs.Flight(say=lambda d: None), JobTrack()
    inc = env.book.open_incident("rank_exited", "job", 10.0)
    frjobs.fr_finding(env, fl, {}, "job", tr, _missing(12), 11.0)
    assert [f["message"] for f in inc.to_dict()["evidence"]["flight_recorder"]] == ["rank 1 never entered all_reduce #12"]


def test_a_job_probed_all_day_keeps_only_the_findings_it_keeps():
    # hangd's memory would grow with every finding a long-lived job ever had
    env, fl, tr = _env(fr_findings_kept=2), frjobs.Flight(say=lambda d: None), JobTrack()
    for seq in range(1, 6):
        frjobs.fr_finding(env, fl, {}, "job", tr, _missing(seq), float(seq))
    assert [f.seq for f in tr.findings] == [4, 5]
    assert sorted(tr.finding_at) == [("missing_rank", "0", 4), ("missing_rank", "0", 5)]


def test_a_rank_that_progressed_just_within_the_quiet_window_is_not_called_missing():
    # a job that progressed a moment ago would be reported as missing a rank from a dump of collectives in flight
    node = _job()
    node.run(1)
    (job_id,) = node.an.job_defs
    env, t = node.an.env, node.t
    env.progress.credit(11, t - env.th.stack_quiet_s, "it wrote to its log", strong=True)
    tr = JobTrack()
    frjobs.fr_finding(env, node.an.flight, node.an.job_defs, job_id, tr, _missing(12), t)
    assert tr.findings == []
    frjobs.fr_finding(env, node.an.flight, node.an.job_defs, job_id, tr, _missing(12), t + 0.25)
    assert [f.message for f in tr.findings] == ["rank 1 never entered all_reduce #12"]
