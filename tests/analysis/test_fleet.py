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


# ------------------------------------------------------------------ flight recorder across nodes


def _dump(rank: int, last: int, size: int = 1024, op: str = "nccl:all_reduce"):
    """A rank's normalized dump: all_reduce #1..#last in the default group, each completed but the
    last (the one it waits in); ``size``/``op`` for its last one."""
    from hangd.flightrec.reader import Dump, Entry

    entries = [Entry(record_id=s - 1, pg="0", pg_id=0, seq=s, p2p_seq=0, op=op if s == last else "nccl:all_reduce",
                     state="scheduled" if s == last else "completed", completed=s < last,
                     input_sizes=[[size if s == last else 1024]], input_dtypes=["Float"],
                     output_sizes=[[size if s == last else 1024]], is_p2p=False, frames=[],
                     time_created_ns=int((1000 + s) * 1e9), timeout_ms=None) for s in range(1, last + 1)]
    return Dump(rank=rank, version="2.10", encoding="pickle",
                pg_config={"0": {"pg_id": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3]}},
                pg_status={"0": {"last_enqueued_collective": last, "last_completed_collective": last - 1}},
                entries=entries)


def _fr_node(b_dumps, read_at: float = 1018.0, reported=lambda t: t - 1, rank3_waits: bool = True) -> Node:
    """Node A's ranks 0, 1 spin in all_reduce #12 and dump at 1020; node-b wrote its ranks' dumps
    (read there at ``read_at``) and reports its ranks 2, 3 as waiting in a collective too."""
    from hangd.snapshot import FrDump, RemoteDump

    node = _node_a()
    node.name = "node-a"
    node.remote = lambda t: [_b(2, True, "waiting_peer", "blocked in a collective", reported(t)),
                             _b(3, rank3_waits, "waiting_peer", "blocked in a collective", reported(t))]
    node.remote_dumps = lambda t: [RemoteDump(job=JOB, node="node-b", rank=d.rank, read_at=read_at,
                                              reported_at=reported(t), dump=d) for d in b_dumps] if t >= read_at else []
    node.run(20)
    node.pending_fr = [FrDump(pid=11 + r, rank=r, format="pickle", path=f"/fr/rank_{r}", dump=_dump(r, 12)) for r in (0, 1)]
    node.run(10)
    return node


def test_a_size_mismatch_between_a_rank_here_and_a_rank_on_another_node_names_that_node():
    node = _fr_node([_dump(2, 12), _dump(3, 12, size=2048)])
    (mm,) = [i for i in node.an.incidents() if i.kind == "collective_mismatch"]
    assert "rank 3 on node-b: [[2048]]" in mm.summary and "rank 0: [[1024]]" in mm.summary, mm.summary
    assert mm.culprit_ranks == [3] and mm.culprit_pids == []  # its pid is node-b's
    assert mm.evidence["rank_nodes"] == {"2": "node-b", "3": "node-b"}
    (f,) = [f for f in node.an.findings if f["kind"] == "size_mismatch"]
    assert f["job"] == JOB and f["seq"] == 12 and f["nodes"] == {"2": "node-b", "3": "node-b"}
    # one incident per family for the job: the hang and the mismatch
    assert sorted(node.kinds()) == ["collective_mismatch", "nccl_stall"]


def test_a_rank_on_another_node_that_never_entered_the_collective_is_blamed_by_the_flight_recorder():
    """Node-b reports rank 3 waiting in a collective (it is: in another one); only the entries of
    both nodes show that it never entered all_reduce #12, which ranks 0-2 wait in."""
    node = _fr_node([_dump(2, 12), _dump(3, 11)])
    (f,) = [f for f in node.an.findings if f["kind"] == "missing_rank"]
    assert f["missing_ranks"] == [3] and f["nodes"] == {"2": "node-b", "3": "node-b"}
    assert f["message"].startswith("rank 3 on node-b never entered all_reduce #12 (1024 float32) in pg 0 (default_pg); "
                                   "ranks 0, 1 and 2 on node-b entered it and wait"), f["message"]
    assert "3 on node-b:11" in f["message"]
    (inc,) = node.an.incidents()
    assert inc.kind == "nccl_stall" and inc.culprit_ranks == [3] and inc.culprit_pids == [], inc.summary
    assert inc.summary.startswith("Flight recorder: rank 3 on node-b never entered all_reduce #12"), inc.summary
    assert "rank 3 on node-b (pid 1233) is not in the collective its peers wait in" in inc.summary, inc.summary
    assert inc.evidence["culprits"] == [{"rank": 3, "node": "node-b", "pid": 1233}]
    assert any(x["kind"] == "missing_rank" for x in inc.findings)


def test_without_the_other_node_s_entries_nobody_is_found_missing():
    """The same hang with node-b's dumps not there: ranks 0, 1 agree; nothing is said of rank 3."""
    node = _fr_node([])
    assert not [f for f in node.an.findings if f["kind"] == "missing_rank"]
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == []


def test_the_dumps_of_a_node_that_stopped_reporting_blame_nobody_and_the_node_is_said_silent():
    node = _fr_node([_dump(2, 12), _dump(3, 11)], reported=lambda t: 990.0)
    assert not [f for f in node.an.findings if f["kind"] == "missing_rank"]
    (silent,) = [f for f in node.an.findings if f["kind"] == "node_silent"]
    assert silent["message"].startswith("node-b: no report since ") and \
        silent["message"].endswith("; the flight-recorder entries of its ranks 2, 3 are not compared"), silent["message"]
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [] and "never entered" not in inc.summary, inc.summary
    assert "node-b: no report since" in inc.summary


def test_a_dump_read_on_another_node_longer_ago_than_the_stale_window_is_not_compared():
    """Node-b reports, but the dump it wrote of rank 3 is old: rank 3 may have moved on since."""
    node = _fr_node([_dump(2, 12), _dump(3, 11)], read_at=1001.0)
    assert not [f for f in node.an.findings if f["kind"] == "missing_rank"]
    (silent,) = [f for f in node.an.findings if f["kind"] == "node_silent"]
    assert "older than 15 s" in silent["message"], silent["message"]
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [], inc.summary


def test_a_finding_made_from_this_node_s_dumps_widens_when_the_other_node_s_dumps_arrive():
    """Node-b holds the culprit: its own dumps show rank 3 missing from #12 at once; node-a's,
    arriving a few seconds later, widen the same finding to the ranks there (one finding, not two)."""
    from hangd.snapshot import FrDump, RemoteDump

    node = Node([P(700, 1), P(701, 700, _env(2), gpu=0, look="spin", state="R", cpu_ticks_per_s=100),
                 P(702, 700, _env(3), gpu=1)])
    node.name = "node-b"
    node.remote = lambda t: [RemoteRank(job=JOB, node="node-a", rank=r, pid=100 + r, state="waiting_peer", reason="",
                                        waits=True, last_progress=900.0, reported_at=t - 1) for r in (0, 1)]
    node.remote_dumps = lambda t: [RemoteDump(job=JOB, node="node-a", rank=r, read_at=1024.0, reported_at=t - 1,
                                              dump=_dump(r, 12)) for r in (0, 1)] if t >= 1024 else []
    node.run(20)
    node.pending_fr = [FrDump(pid=701, rank=2, format="pickle", path="/fr/rank_2", dump=_dump(2, 12)),
                       FrDump(pid=702, rank=3, format="pickle", path="/fr/rank_3", dump=_dump(3, 11))]
    node.run(2)
    (tr,) = [tr for tr in node.an.job_tracks.values() if tr.fr]
    (f,) = [f for f in tr.findings if f.kind == "missing_rank"]
    assert f.ranks == [2] and f.missing_ranks == [3]
    node.run(6)
    (f,) = [f for f in tr.findings if f.kind == "missing_rank"]
    assert f.ranks == [0, 1, 2] and f.missing_ranks == [3], f.message
    assert "ranks 0, 1 on node-a and 2 entered it and wait" in f.message, f.message
    (inc,) = node.an.incidents()
    assert [x["ranks"] for x in inc.findings if x["kind"] == "missing_rank"] == [[0, 1, 2]]
    assert inc.culprit_ranks == [3] and inc.culprit_pids == [702], inc.summary
    assert node.an.take_fr_dumps().keys() == {(JOB, 2), (JOB, 3)}  # for node-a, through the store


def _node_b_waiting_in_broadcast() -> Node:
    """Node B's two ranks (2, 3) blocked host-side in a collective (their stacks say so), GPUs idle."""
    node = Node([P(10, 1), P(21, 10, _env(2), gpu=0), P(22, 10, _env(3), gpu=1)])
    node.name = "node-b"
    return node


def _stack_in_broadcast(node: Node, pids: list[int]) -> None:
    for pid in pids:
        node.stack(pid, [("torch/distributed/distributed_c10d.py", "broadcast"), ("worker.py", "loop")])


def test_an_idle_server_across_nodes_is_not_a_hang():
    """An inference server over two nodes with no requests: the coordinator (rank 0, on node-a) waits
    for requests, the workers here wait for it in a broadcast. Serving, not hung, however long."""
    node = _node_b_waiting_in_broadcast()

    def remote(t: float) -> list[RemoteRank]:
        return [RemoteRank(job=JOB, node="node-a", rank=0, pid=7, state="idle", reason="waiting for requests",
                           waits=False, last_progress=900.0, reported_at=t - 1, local="serving",
                           reading="its stack is waiting for requests (zmq recv)"),
                RemoteRank(job=JOB, node="node-a", rank=1, pid=8, state="waiting_peer", reason="broadcast",
                           waits=True, last_progress=900.0, reported_at=t - 1, local="waiting")]
    node.remote = remote
    for _ in range(12):
        _stack_in_broadcast(node, [21, 22])
        node.run(10)
    assert node.kinds() == [], [i.summary for i in node.an.incidents()]


def test_the_node_of_the_culprit_says_the_job_is_hung_and_names_its_rank():
    """Rank 3, this node's only rank, waits on an event; ranks 0-2 on node-a wait in the collective:
    this node too judges the job hung (one incident for the job) and names its own rank 3."""
    node = Node([P(10, 1), P(22, 10, _env(3), gpu=1)])
    node.name = "node-b"
    node.remote = lambda t: [RemoteRank(job=JOB, node="node-a", rank=r, pid=5 + r, state="hung", reason="in all_reduce",
                                        waits=True, last_progress=900.0, reported_at=t - 1, local="waiting")
                             for r in (0, 1, 2)]
    for _ in range(4):
        node.stack(22, [("threading.py", "wait"), ("train.py", "main")])
        node.run(10)
    (inc,) = node.an.incidents()
    assert inc.kind == "host_stall" and inc.culprit_ranks == [3], inc.summary
    assert inc.summary.startswith("rank 3 on node-b (pid 22) is not in the collective its peers wait in"), inc.summary
    assert node.state(22) == "hung"


def test_a_mismatch_seen_first_between_two_ranks_here_is_judged_again_when_the_other_node_s_dumps_arrive():
    """Ranks 0 and 1 here disagree on the size of all_reduce #12: with two ranks the odd one cannot
    be told, so the higher is named. Node-b's ranks 2 and 3, arriving later, side with rank 1: the
    incident then names rank 0, from one finding over all four ranks."""
    from hangd.snapshot import FrDump, RemoteDump

    node = _node_a()
    node.name = "node-a"
    node.remote = lambda t: [_b(r, True, "waiting_peer", "blocked in a collective", t - 1) for r in (2, 3)]
    node.remote_dumps = lambda t: [RemoteDump(job=JOB, node="node-b", rank=r, read_at=1024.0, reported_at=t - 1,
                                              dump=_dump(r, 12)) for r in (2, 3)] if t >= 1024 else []
    node.run(20)
    node.pending_fr = [FrDump(pid=11, rank=0, format="pickle", path="/fr/rank_0", dump=_dump(0, 12, size=2048)),
                       FrDump(pid=12, rank=1, format="pickle", path="/fr/rank_1", dump=_dump(1, 12))]
    node.run(2)
    (mm,) = [i for i in node.an.incidents() if i.kind == "collective_mismatch"]
    assert mm.culprit_ranks == [1], mm.summary
    node.run(8)
    (mm,) = [i for i in node.an.incidents() if i.kind == "collective_mismatch"]
    assert mm.culprit_ranks == [0] and mm.culprit_pids == [11], mm.summary
    assert mm.ranks == [0, 1, 2, 3] and "rank 3 on node-b: [[1024]]" in mm.summary, mm.summary
    assert [x["ranks"] for x in mm.findings if x["kind"] == "size_mismatch"] == [[0, 1, 2, 3]], mm.findings


# ------------------------------------------------------------------ idle servers and later hangs across nodes

ACCEPT = [("socket.py", "accept"), ("server.py", "serve")]
BCAST = [("torch/distributed/distributed_c10d.py", "broadcast"), ("worker.py", "loop")]


def _node_a_with_coordinator() -> Node:
    """Node A: rank 0 is the server's coordinator (waits for requests in accept), rank 1 a worker
    spinning in the NCCL broadcast the coordinator will issue."""
    node = Node([P(10, 1), P(11, 10, _env(0), gpu=0, wchan="inet_csk_accept"),
                 P(12, 10, _env(1), gpu=1, look="spin", state="R", cpu_ticks_per_s=100)])
    node.name = "node-a"
    return node


def _run(node):
    node.run(5)
    node.stack(11, ACCEPT)
    node.stack(12, BCAST)
    node.run(120)


def test_an_idle_server_on_one_node_of_a_spanning_job_without_remote_ranks_is_not_a_hang():
    node = _node_a_with_coordinator()
    _run(node)
    assert node.kinds() == []


def test_an_idle_server_is_not_a_hang_when_another_node_cannot_tell_its_workers_wait():
    """Node-b's two workers wait in the broadcast host-side (gloo) but node-b cannot take stacks
    (py-spy missing): its hangd reports them quiet, not waiting. Node A alone is an idle server."""
    node = _node_a_with_coordinator()
    node.remote = lambda t: [RemoteRank(job=JOB, node="node-b", rank=r, pid=20 + r, state="idle", reason="asleep",
                                        waits=False, last_progress=900.0, reported_at=t - 1, local="quiet")
                             for r in (2, 3)]
    _run(node)
    assert node.kinds() == [], [(i.kind, i.summary) for i in node.an.incidents()]


def test_an_idle_server_is_not_a_hang_beside_a_node_that_runs_an_older_hangd():
    """Node-b runs an older hangd (no local column): its workers wait (waits=True), so nothing breaks;
    but a worker there that is between captures (waits=False, local=None) does."""
    node = _node_a_with_coordinator()
    node.remote = lambda t: [RemoteRank(job=JOB, node="node-b", rank=2, pid=22, state="waiting_peer", reason="",
                                        waits=True, last_progress=900.0, reported_at=t - 1, local=None),
                             RemoteRank(job=JOB, node="node-b", rank=3, pid=23, state="idle", reason="",
                                        waits=False, last_progress=900.0, reported_at=t - 1, local=None)]
    _run(node)
    assert node.kinds() == [], [(i.kind, i.summary) for i in node.an.incidents()]


def _node_a_with_two_hangs(state: dict) -> Node:
    """Node-a beside node-b's ranks 2 and 3 through episodes: ``state["ep"]`` 1 (both wait in a
    collective), 0 (the job runs again), 2 (rank 2 asleep, rank 3 waits); node-b's dumps are
    ``state["b"]``, read at ``state["read_at"]``."""
    from hangd.snapshot import RemoteDump

    node = _node_a()
    node.name = "node-a"

    def remote(t):
        if state["ep"] == 0:  # the job runs again
            return [_b(r, False, "busy", "working", t - 1, progress=t - 1) for r in (2, 3)]
        if state["ep"] == 1:
            return [_b(r, True, "waiting_peer", "blocked", t - 1) for r in (2, 3)]
        return [_b(2, False, "hung", "asleep", t - 1), _b(3, True, "waiting_peer", "blocked", t - 1)]
    node.remote = remote
    node.remote_dumps = lambda t: [RemoteDump(job=JOB, node="node-b", rank=d.rank, read_at=state["read_at"],
                                              reported_at=t - 1, dump=d) for d in state["b"]] if t >= state["read_at"] else []
    return node


def _episode(node: Node, state: dict, ep: int, look: str, seconds: float) -> None:
    """Node-b's ranks enter episode ``ep``; node-a's ranks look ``look`` (work or spin) for ``seconds``."""
    state["ep"] = ep
    for pid in (11, 12):
        node.procs[pid].look = look
    node.run(seconds)


def test_a_second_hang_blames_the_rank_missing_now_not_the_one_missing_in_the_first():
    from hangd.snapshot import FrDump

    state = {"ep": 1, "read_at": 1018.0, "b": [_dump(2, 12), _dump(3, 11)]}
    node = _node_a_with_two_hangs(state)
    node.run(20)
    node.pending_fr = [FrDump(pid=11 + r, rank=r, format="pickle", path=f"/fr/rank_{r}", dump=_dump(r, 12)) for r in (0, 1)]
    node.run(10)
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [3]
    # the job resumes
    _episode(node, state, 0, "work", 30)
    assert not inc.open, inc.timeline
    # a second hang, in all_reduce #40: rank 2 on node-b is the one missing this time
    _episode(node, state, 2, "spin", 25)
    state["read_at"], state["b"] = node.t + 1, [_dump(2, 39), _dump(3, 40)]
    node.run(5)
    node.pending_fr = [FrDump(pid=11 + r, rank=r, format="pickle", path=f"/fr/rank_{r}", dump=_dump(r, 40)) for r in (0, 1)]
    node.run(10)
    new = [i for i in node.an.incidents() if i.open]
    assert len(new) == 1 and new[0].culprit_ranks == [2], (new[0].culprit_ranks, new[0].summary)


def test_this_node_s_dumps_of_an_earlier_hang_are_not_compared_with_the_other_node_s_of_this_one():
    """Hang 1 (all ranks stuck in #12, no one missing) resolves. In hang 2, rank 2 on node-b never
    enters #40; node-b reads its dumps a few seconds before node-a reads its own."""
    from hangd.snapshot import FrDump

    def stuck(rank, last):  # every rank entered #last; none completed it
        return _dump(rank, last)

    state = {"ep": 1, "read_at": 1018.0, "b": [stuck(2, 12), stuck(3, 12)]}
    node = _node_a_with_two_hangs(state)
    node.run(20)
    node.pending_fr = [FrDump(pid=11 + r, rank=r, format="pickle", path=f"/fr/rank_{r}", dump=stuck(r, 12)) for r in (0, 1)]
    node.run(10)
    (inc,) = node.an.incidents()
    _episode(node, state, 0, "work", 30)
    assert not inc.open
    _episode(node, state, 2, "spin", 25)
    state["read_at"], state["b"] = node.t + 0.5, [_dump(2, 39), stuck(3, 40)]
    node.run(3)
    node.pending_fr = [FrDump(pid=11 + r, rank=r, format="pickle", path=f"/fr/rank_{r}", dump=stuck(r, 40)) for r in (0, 1)]
    node.run(10)
    (new,) = [i for i in node.an.incidents() if i.open]
    assert new.culprit_ranks == [2], (new.culprit_ranks, new.culprit_pids, new.summary)
