"""Behaviour the earlier analysis tests let vary: owners' words, plurals, evidence fields, and edges."""

from __future__ import annotations

from hangd.analysis import owner
from hangd.analysis.facts.job import caught_completing
from hangd.analysis.nodeview import ProcHistory
from hangd.analysis.progress import ProgressBook
from hangd.analysis.thresholds import Thresholds
from hangd.snapshot import FrDump, ProcInfo, RemoteRank

from .builders import GiB, Node, P, torchrun_env
from .test_detectors import _diverged
from .test_exact_readings import COLL, ELSEWHERE, WORK, _ranks
from .test_fleet import _dump
from .test_one_wait import ALL_REDUCE, NCCL, _job, _spin
from .test_straggler import _step

AR = ("torch/distributed/distributed_c10d.py", "all_reduce", 2950)
BAR = ("torch/distributed/distributed_c10d.py", "barrier", 5356)
JOB = "rdzv:10.0.0.1:29400"


def test_two_owners_of_a_job_are_listed_comma_separated():
    ranks = [ProcHistory(pid=1, first_seen=0, info=ProcInfo(pid=1, uid=1000, user="alice")),
             ProcHistory(pid=2, first_seen=0, info=ProcInfo(pid=2, uid=1001, user="bob"))]
    w = owner.who(ranks)
    assert w["user"] == "alice, bob"
    assert "uid" not in w  # two uids: none is the job's
    assert w["text"] == "owner alice, bob"


def test_a_pod_is_named_with_its_namespace_and_container():
    text = owner.describe({"pod": {"name": "train-0", "namespace": "ml", "container": "trainer"}})
    assert text == "pod ml/train-0 (container trainer)"


def test_a_pod_without_a_namespace_or_container_is_named_alone():
    assert owner.describe({"pod": {"name": "train-0"}}) == "pod train-0"


def test_two_ranks_against_three_are_the_odd_ones_out_in_the_plural():
    loop = [("train.py", "train", 40), ("train.py", "<module>", 99)]
    odd = [("train.py", "train", 30), ("train.py", "<module>", 99)]
    inc = _diverged({11: [BAR, *odd], 12: [BAR, *odd], 13: [AR, *loop], 14: [AR, *loop], 15: [AR, *loop]},
                    world=5)
    assert inc.culprit_ranks == [0, 1], inc.summary
    assert "ranks 0, 1 are the odd ones out: 3 ranks wait in all_reduce" in inc.summary, inc.summary


def test_two_ranks_further_along_than_two_others_are_said_in_the_plural():
    loop = [("train.py", "train", 40), ("train.py", "<module>", 99)]
    after = [("train.py", "train", 52), ("train.py", "<module>", 99)]
    inc = _diverged({11: [AR, *loop], 12: [AR, *loop], 13: [BAR, *after], 14: [BAR, *after]}, world=4)
    assert inc.culprit_ranks == [2, 3], inc.summary
    assert "ranks 2, 3 went further in train.py:train (line 52, the others at line 40)" in inc.summary, \
        inc.summary


def _env(rank: int) -> dict[str, str]:
    return torchrun_env(rank, 4, port=29400, LOCAL_WORLD_SIZE="2", GROUP_WORLD_SIZE="2", MASTER_ADDR="10.0.0.1")


def _node_a() -> Node:
    """Node A's two ranks spin in a NCCL collective (a stall's signature)."""
    return Node([P(10, 1), P(11, 10, _env(0), gpu=0, look="spin", state="R", cpu_ticks_per_s=100),
                 P(12, 10, _env(1), gpu=1, look="spin", state="R", cpu_ticks_per_s=100)])


def _b(rank: int, waits: bool | None, state: str, reason: str, reported: float) -> RemoteRank:
    return RemoteRank(job=JOB, node="node-b", rank=rank, pid=1230 + rank, state=state, reason=reason, waits=waits,
                      last_progress=900.0, reported_at=reported)


def test_a_silent_node_with_one_rank_names_it_in_the_singular():
    node = _node_a()
    node.remote = lambda t: [_b(3, False, "straggler", "asleep", 990.25)]
    node.run(30)
    (inc,) = node.an.incidents()
    assert "(rank 3 not judged)" in inc.summary, inc.summary
    assert inc.evidence["nodes"]["node-b"]["last_report"] == 990.25  # to the millisecond, not the second


def test_a_remote_culprit_in_the_evidence_carries_its_pid():
    node = _node_a()
    node.remote = lambda t: [_b(2, True, "waiting_peer", "blocked in a collective", t - 1),
                             _b(3, False, "hung", "asleep", t - 1)]
    node.run(30)
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [3], inc.summary
    assert inc.evidence["remote_culprits"] == [{"rank": 3, "node": "node-b", "pid": 1233, "state": "hung",
                                                "reason": "asleep"}]


def test_memory_no_process_holds_is_said_beside_what_the_visible_ones_hold():
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0, look="work", state="R", cpu_ticks_per_s=95)])
    node.hidden[0] = (5 * GiB, "idle")  # another container's process: NVML does not list it
    node.run(node.an.th.unattributed_gpu_s + 10)
    (inc,) = [i for i in node.an.incidents() if i.kind == "orphaned_gpu_memory"]
    assert inc.summary.startswith("GPU 0 has 4.0 GiB in use that no visible process holds "
                                  "(used 25.0 GiB, processes 20.0 GiB): "), inc.summary


def test_straggling_steps_right_after_a_hang_ends_open_no_straggler_incident():
    node = _ranks(2, look="work", state="R", cpu_ticks_per_s=100)
    node.run(5)
    node.procs[11].look, node.procs[12].look = "spin", "idle"
    node.procs[12].state, node.procs[12].cpu_ticks_per_s = "S", 0
    node.stack(11, COLL)
    node.stack(12, ELSEWHERE)
    node.run(25)
    (hang,) = node.an.incidents()
    assert hang.kind == "nccl_stall" and hang.open
    node.procs[11].look = node.procs[12].look = "work"
    node.procs[12].state, node.procs[12].cpu_ticks_per_s = "R", 100
    node.stack(11, WORK)
    node.stack(12, WORK)
    node.run(3)
    for _ in range(6):
        _step(node, 1, 2)  # rank 0 waits 2 s of every 3 on rank 1, within the window of the hang's waits
    assert not hang.open and node.kinds() == ["nccl_stall"], [(i.kind, i.summary) for i in node.an.incidents()]


def test_a_flight_recorder_naming_a_missing_rank_makes_ranks_at_one_call_a_hang_before_their_own_threshold():
    th = Thresholds()
    node, ranks = _job(4)
    for r in ranks:
        r.look = "spin"
    node.run(2)
    for r in ranks:
        node.stack(r.pid, ALL_REDUCE, threads=NCCL)
    node.run(1)
    # rank 3's recorder stops at all_reduce #11: it never entered the #12 the others wait in
    node.pending_fr = [FrDump(pid=r.pid, rank=i, format="pickle", path=f"/fr/rank_{i}",
                              dump=_dump(i, 12 if i < 3 else 11)) for i, r in enumerate(ranks)]
    node.run(th.hang_gpu_s + 4)  # well short of hang_all_in_s
    (inc,) = node.an.incidents()
    assert inc.kind == "nccl_stall" and inc.culprit_ranks == [3], inc.summary
    assert inc.summary.startswith("Flight recorder: rank 3 never entered all_reduce #12"), inc.summary


def test_collectives_seen_completing_with_no_dump_time_count_as_caught_completing():
    book = ProgressBook(Thresholds())
    book.credit(11, 1000.0, "collectives completed", strong=True, collectives_per_s=5.0)  # no dump time
    assert caught_completing(book.of(11), Thresholds()) is True
    assert caught_completing(book.of(12), Thresholds()) is False  # never seen completing


def test_ranks_at_one_call_name_its_caller_by_file_name_not_full_path():
    th = Thresholds()
    site = [("/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", "all_reduce", 3068),
            ("/job/train.py", "step", 40), ("/job/train.py", "main", 80)]
    node, ranks = _job(2)
    _spin(node, ranks, [site] * 2, th.hang_gpu_s + 4)
    assert node.kinds() == []
    reason = node.an._track(ranks[-1].pid).reason
    assert reason.startswith("every rank of the job waits at the same call (all_reduce from train.py:step:40): "), \
        reason


def _pair_with(**env: str) -> Node:
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2, **env), gpu=0, look="work"),
                 P(12, 10, torchrun_env(1, 2, **env), gpu=1, look="work")])
    node.run(3)
    return node


def test_a_slurm_job_is_keyed_by_its_job_id_alone_and_named_by_its_run_id():
    (job,) = _pair_with(SLURM_JOB_ID="1234").jobs()
    assert job["job"] == "slurm:1234"  # the Slurm job id is unique: no launcher pid in the key
    (job,) = _pair_with(SLURM_JOB_ID="1234", run_id="llama-7b").jobs()
    assert (job["job"], job["name"]) == ("slurm:1234", "llama-7b")
    (job,) = _pair_with(run_id="llama-7b").jobs()
    assert (job["job"], job["name"]) == ("te:llama-7b", "llama-7b")


def test_workers_of_a_process_pool_are_not_called_dataloader_workers():
    pool = [("multiprocessing/pool.py", "get"), ("train.py", "step")]
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0),
                 *(P(21 + i, 11, wchan="pipe_read") for i in range(2))])
    node.run(3)
    node.stack(11, pool)
    node.run(3)
    reason = next(p["reason"] for p in node.an.processes() if p["pid"] == 11)
    assert reason.endswith("): its workers pid 21 (sleeping in pipe_read for 5 s), "
                           "pid 22 (sleeping in pipe_read for 5 s)"), reason
