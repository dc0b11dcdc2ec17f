"""The analyzer's public surface as the daemon, the API and `hangd status` use it: incidents by id,
acknowledging, incidents carried over a restart, command lines, the GPU views."""

from __future__ import annotations

from hangd.analysis.engine import Analyzer

from .builders import GiB, Node, P, torchrun_env
from .test_detectors import hang_node, stacks


def _hung() -> tuple[Node, int]:
    node = hang_node()
    stacks(node)
    node.run(15)
    (inc,) = node.an.incidents()
    return node, inc.id


def test_an_incident_is_found_by_its_id_and_acknowledged_once_for_all_readers():
    node, iid = _hung()
    an = node.an
    assert an.incident(iid) is an.incidents()[0]
    assert an.incident(iid + 1) is None
    assert not an.incident(iid).acked
    assert an.ack(iid) is an.incident(iid) and an.incident(iid).acked
    assert an.ack(999) is None
    assert an.opened_counts() == {"host_stall": 1}
    assert [i.id for i in an.incidents(open_only=True)] == [iid]


def _record(iid: int, job: str, kind: str = "host_stall") -> dict:
    return {"id": iid, "kind": kind, "job": job, "opened_at": 900.0, "severity": "critical",
            "summary": "rank 1 is not in broadcast", "culprit_ranks": [1], "pids": [11, 12], "ranks": [0, 1]}


def test_after_a_restart_a_hang_still_there_continues_under_its_id():
    node = hang_node()
    job = node.jobs()[0]["job"]
    an2 = Analyzer()
    node.an = an2
    an2.adopt([_record(41, job)], next_id=42)
    assert an2.has_adopted()
    assert [i.id for i in an2.incidents(open_only=True)] == [41]  # open in the API before the analysis sees it again
    assert an2.incident(41) is not None and an2.incident(41).summary == "rank 1 is not in broadcast"
    node.sent_info.clear()  # the new daemon learns the processes anew
    node.run(2)
    stacks(node)
    node.run(15)
    an2.resolve_adopted(node.t)
    opened = an2.incidents(open_only=True)
    assert [(i.id, i.kind) for i in opened] == [(41, "host_stall")], [(i.id, i.kind, i.summary) for i in an2.incidents()]
    assert opened[0].culprit_ranks == [1]


def test_after_a_restart_an_incident_of_a_job_that_is_gone_is_resolved_with_the_reason():
    an = Analyzer()
    an.adopt([_record(7, "rdzv:10.0.0.9:29500@77"), _record(8, "rdzv:10.0.0.9:29500@77", kind="orphaned_memory")],
             next_id=5)
    assert an.has_adopted() and len(an.incidents(open_only=True)) == 2
    an.resolve_adopted(2000.0)
    assert not an.has_adopted()
    assert an.incidents(open_only=True) == []
    # the store learns it (the analysis keeps no copy: the store's is the one the API reads)
    drained = {i.id: i for i in an.drain()}
    assert sorted(drained) == [7, 8]
    gone = drained[7]
    assert gone.resolved_at == 2000.0 and not gone.open
    assert "not seen again after hangd restarted" in gone.timeline[-1]["note"]
    # numbering continues after the highest id the store had, never reusing one
    n2 = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=0), P(12, 10, torchrun_env(1, 2), gpu=1)], analyzer=an)
    n2.run(5)
    n2.stack(11, [("torch/distributed/distributed_c10d.py", "broadcast_object_list"), ("server.py", "loop")])
    n2.stack(12, [("threading.py", "wait"), ("server.py", "start")])
    n2.run(15)
    assert [i.id for i in an.incidents(open_only=True)] == [9]


def test_the_next_id_is_never_below_what_the_store_handed_over():
    an = Analyzer()
    an.adopt([], next_id=100)
    assert not an.has_adopted()
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=0), P(12, 10, torchrun_env(1, 2), gpu=1)], analyzer=an)
    node.run(5)
    stacks(node)
    node.run(15)
    assert [i.id for i in an.incidents()] == [100]


def test_command_lines_are_given_whole_and_absent_ones_as_none():
    node = Node([P(10, 1, cmdline=["torchrun", "--nproc-per-node", "2", "train.py"]),
                 P(11, 10, torchrun_env(0, 2), cmdline=["python", "-u", "train.py", "--lr", "3e-4"], gpu=0),
                 P(12, 10, torchrun_env(1, 2), cmdline=[], gpu=1)])
    node.run(3)
    an = node.an
    assert an.cmdline(11) == ["python", "-u", "train.py", "--lr", "3e-4"]
    assert an.cmdline(12) is None and an.cmdline(4242) is None
    by_pid = {p["pid"]: p for p in an.processes()}
    assert by_pid[11]["command"] == "python -u train.py --lr 3e-4"
    assert by_pid[12]["command"] is None


def test_gpu_views_report_the_newest_reading_of_every_gpu():
    node = Node([P(11, 10, torchrun_env(0, 2), gpu=0, look="work", gpu_mem=30 * GiB),
                 P(12, 10, torchrun_env(1, 2), gpu=1, look="idle", gpu_mem=0)])
    node.run(2)
    an = node.an
    gpus = an.gpus()
    assert [g["index"] for g in gpus] == [0, 1]
    g0, g1 = gpus
    assert g0["util_gpu"] == 99 and g0["power_w"] == 470.0 and g0["mem_used"] == 30 * GiB
    assert g0["mem_total"] == 141 * GiB and g0["gpm"]["SM_UTIL"] == 85.0
    assert g0["processes"] == [{"pid": 11, "used": 30 * GiB}]
    assert g1["util_gpu"] == 0 and g1["power_w"] == 124.0 and g1["processes"] == [{"pid": 12, "used": 0}]
    latest = an.latest_gpus()
    assert sorted(latest) == [0, 1] and latest[0].power_mw == 470_000
    node.procs[11].look = "idle"
    node.tick()  # one new reading: the newest, not the one before, is reported
    assert an.latest_gpus()[0].power_mw == 124_000 and an.gpus()[0]["util_gpu"] == 0


def test_a_node_without_gpu_readings_reports_gpu_memory_as_unknown_not_zero():
    an = Analyzer()
    assert an.gpus() == [] and an.latest_gpus() == {}
    from hangd.snapshot import ProcInfo, ProcSample, Snapshot

    for k in range(3):
        snap = Snapshot(t=1000.0 + k)
        snap.procs.append(ProcSample(pid=11, ppid=10, comm="python", state="S", utime=0, stime=0, threads=8,
                                     wchan="futex_do_wait", rss_bytes=GiB, start_time=999.0))
        if k == 0:
            snap.infos.append(ProcInfo(pid=11, ppid=10, cmdline=["python", "t.py"], environ=torchrun_env(0, 1),
                                       fds={}, start_time=999.0))
        an.step(snap)
    procs = an.processes()
    assert procs and procs[0]["gpu_mem_bytes"] is None and procs[0]["gpus"] == []


def test_after_a_restart_only_hangs_of_jobs_still_here_wait_for_the_analysis():
    node = hang_node()
    job = node.jobs()[0]["job"]
    an = node.an
    an.adopt([_record(50, job), _record(51, job, kind="orphaned_memory"), _record(52, "rdzv:10.0.0.9:1@2")], next_id=53)
    an.resolve_adopted(node.t)
    resolved = sorted(i.id for i in an.drain() if not i.open)
    assert resolved == [51, 52]  # a leftover-memory incident is re-judged by its own detector; a gone job's ends
    assert an.has_adopted() and [i.id for i in an.incidents(open_only=True)] == [50]
