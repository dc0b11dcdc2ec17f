"""A job that spans nodes: the ranks other nodes report (read from the shared store by the
daemon, handed in as the snapshot's ``remote`` part) take part in the diagnosis of this node's
ranks: a culprit can be a rank on another node, a node that stopped reporting is named and never
blamed, progress on another node means the job progresses."""

from __future__ import annotations

from hangd.snapshot import RemoteRank

from .builders import Node, P, torchrun_env

JOB = "rdzv:10.0.0.1:29400"


def _env(rank: int) -> dict[str, str]:
    return torchrun_env(rank, 4, port=29400, LOCAL_WORLD_SIZE="2", GROUP_WORLD_SIZE="2", MASTER_ADDR="10.0.0.1")


def _node_a() -> Node:
    """Node A's two ranks spin in a NCCL collective (a stall's signature)."""
    return Node([P(10, 1), P(11, 10, _env(0), gpu=0, look="spin", state="R", cpu_ticks_per_s=100),
                 P(12, 10, _env(1), gpu=1, look="spin", state="R", cpu_ticks_per_s=100)])


def _b(rank: int, waits: bool | None, state: str, reason: str, reported: float, progress: float | None = 900.0) -> RemoteRank:
    return RemoteRank(job=JOB, node="node-b", rank=rank, pid=1230 + rank, state=state, reason=reason, waits=waits,
                      last_progress=progress, reported_at=reported)


def test_the_culprit_can_be_a_rank_on_another_node():
    node = _node_a()
    asleep = "its stack is sleeping (time.sleep)"
    node.remote = lambda t: [_b(2, True, "waiting_peer", "blocked in a collective", t - 1),
                             RemoteRank(job=JOB, node="node-b", rank=3, pid=1233, state="hung", reason="job hung: ...",
                                        waits=False, last_progress=900.0, reported_at=t - 1, reading=asleep)]
    node.run(30)
    (inc,) = node.an.incidents()
    assert inc.kind == "nccl_stall" and inc.job == JOB
    assert inc.culprit_ranks == [3] and inc.culprit_pids == []  # its pid lives on node-b, named in the words
    assert "rank 3 on node-b (pid 1233) is not in the collective its peers wait in: rank 3 on node-b: " + asleep \
        in inc.summary, inc.summary
    assert "rank 2 on node-b waits in a collective too" in inc.summary, inc.summary
    assert inc.ranks == [0, 1, 2, 3]
    assert inc.evidence["remote_culprits"][0]["node"] == "node-b"
    assert inc.evidence["nodes"]["node-b"]["stale"] is False


def test_a_node_that_stopped_reporting_is_named_and_never_blamed():
    node = _node_a()
    node.remote = lambda t: [_b(2, True, "waiting_peer", "blocked", 990.0), _b(3, False, "straggler", "asleep", 990.0)]
    node.run(30)
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [] and "node-b" in inc.summary
    assert "node-b: no report since" in inc.summary and "(ranks 2, 3 not judged)" in inc.summary, inc.summary
    assert "is not in the collective" not in inc.summary
    assert inc.evidence["nodes"]["node-b"]["stale"] is True


def test_a_remote_culprit_whose_node_stops_reporting_is_no_longer_blamed():
    node = _node_a()
    reported = {"t": 0.0}

    def remote(t: float) -> list[RemoteRank]:
        reported["t"] = t - 1 if t < 1025 else reported["t"]  # node-b's hangd dies at 1025
        return [_b(2, True, "waiting_peer", "blocked", reported["t"]), _b(3, False, "straggler", "asleep", reported["t"])]
    node.remote = remote
    node.run(24)
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [3]
    node.run(30)
    assert inc.culprit_ranks == [] and "node-b: no report since" in inc.summary, inc.summary


def test_progress_on_another_node_means_the_job_is_not_hung():
    """Ranks here wait while a rank on another node saves a checkpoint: the job progresses."""
    node = _node_a()
    node.remote = lambda t: [_b(2, True, "waiting_peer", "blocked", t - 1, progress=t - 1),
                             _b(3, False, "busy", "saving", t - 1, progress=t - 1)]
    node.run(60)
    assert node.kinds() == []


def test_without_remote_ranks_a_spanning_job_is_diagnosed_from_its_own_ranks():
    node = _node_a()
    node.run(30)
    (inc,) = node.an.incidents()
    assert inc.kind == "nccl_stall" and inc.culprit_ranks == [] and inc.evidence["nodes"] == {}
    assert node.an.spanning_jobs() == {JOB}
    rank = next(p for p in node.an.processes() if p["pid"] == 11)
    assert rank["world_size"] == 4 and rank["waits"] is True


def test_a_single_node_job_ignores_remote_ranks_and_says_nothing_of_nodes():
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=0, look="spin", state="R", cpu_ticks_per_s=100),
                 P(12, 10, torchrun_env(1, 2), gpu=1, look="spin", state="R", cpu_ticks_per_s=100)])
    node.remote = lambda t: [RemoteRank(job="rdzv:127.0.0.1:29500@10", node="node-b", rank=3, pid=5, state="busy",
                                        reason="", waits=False, last_progress=t, reported_at=t)]
    node.run(30)
    (inc,) = node.an.incidents()
    assert "nodes" not in inc.evidence and "node-b" not in inc.summary
    assert all("waits" not in p for p in node.an.processes())


COLL = [("torch/distributed/distributed_c10d.py", "all_reduce"), ("train.py", "main")]


def test_a_rank_here_between_two_stack_captures_does_not_take_the_blame_from_a_rank_on_another_node():
    """Host-side waits (gloo): both ranks here sit in all_reduce. When one of them leaves the
    kernel wait point its last stack was taken at, its stack no longer describes it for a while;
    it is still not the rank the job waits for, rank 3 on node-b is."""
    node = Node([P(10, 1), P(11, 10, _env(0)), P(12, 10, _env(1))])
    node.remote = lambda t: [_b(2, True, "waiting_peer", "blocked", t - 1), _b(3, False, "straggler", "asleep", t - 1)]
    node.run(3)
    node.stack(11, COLL)
    node.stack(12, COLL)
    node.run(25)
    (inc,) = node.an.incidents()
    assert inc.kind == "host_stall" and inc.culprit_ranks == [3], inc.summary
    node.procs[12].wchan = "do_epoll_wait"  # its stack of a moment ago no longer says where it is
    node.run(10)
    assert inc.culprit_ranks == [3], inc.summary
    assert "rank 1 (pid 12) is not in the collective" not in inc.summary


EVENT = [("threading.py", "wait"), ("train.py", "main")]


def test_the_node_that_holds_the_culprit_names_it_with_its_node_and_the_waiting_ranks_elsewhere():
    node = Node([P(700, 1), P(701, 700, _env(2)), P(702, 700, _env(3))])
    node.name = "node-b"
    node.remote = lambda t: [RemoteRank(job=JOB, node="node-a", rank=r, pid=100 + r, state="waiting_peer", reason="",
                                        waits=True, last_progress=900.0, reported_at=t - 1) for r in (0, 1)]
    node.run(3)
    node.stack(701, COLL)
    node.stack(702, EVENT)
    node.run(25)
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [3] and inc.culprit_pids == [702]
    assert inc.summary.startswith("rank 3 on node-b (pid 702) is not in the collective its peers wait in"), inc.summary
    assert "ranks 0, 1 on node-a wait in a collective too" in inc.summary, inc.summary
    assert inc.evidence["culprits"] == [{"rank": 3, "node": "node-b", "pid": 702}]


def test_a_recorded_trace_keeps_the_other_nodes_ranks_and_its_replay_gives_the_same_diagnosis(tmp_path):
    from hangd.analysis.engine import Analyzer
    from hangd.trace import TraceReader, TraceWriter

    node = _node_a()
    node.name = "node-a"
    node.remote = lambda t: [_b(2, True, "waiting_peer", "blocked in a collective", t - 1),
                             _b(3, False, "straggler", "asleep (hrtimer_nanosleep)", t - 1)]
    recorded = []
    step = node.an.step
    node.an.step = lambda snap: (recorded.append(snap), step(snap))[1]  # type: ignore[method-assign]
    node.run(30)
    with TraceWriter(tmp_path / "t", {"scenario": "fleet"}) as w:
        for snap in recorded:
            w.write(snap)
    again = list(TraceReader(tmp_path / "t").snapshots())
    assert [s.remote for s in again] == [s.remote for s in recorded] and again[-1].node == "node-a"
    replayed = Analyzer()
    for snap in again:
        replayed.step(snap)
    (live,), (inc,) = node.an.incidents(), replayed.incidents()
    assert inc.summary == live.summary and inc.culprit_ranks == [3], inc.summary
