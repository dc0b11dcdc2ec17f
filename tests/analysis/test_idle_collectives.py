"""An idle NCCL server whose waiting rank never wakes: rank 0 polls an empty queue and broadcasts an
empty batch many times a second; rank 1 waits in each broadcast spinning (on its GPU and, synchronizing,
on its CPU), so its main thread shows no wake-ups. Only its flight recorder says the collectives keep
completing: the dumps hangd asks for while ranks wait on ranks that do no work."""

from __future__ import annotations

import pytest

from hangd.flightrec.reader import Dump, Entry
from hangd.snapshot import FrDump

from .builders import Node, P, torchrun_env

BCAST = [("torch/distributed/distributed_c10d.py", "broadcast"), ("server.py", "event_loop")]
POLL = [("threading.py", "wait"), ("queue.py", "get"), ("server.py", "event_loop")]


def _dump(rank: int, done: int, at: float, world: int = 2) -> Dump:
    """A rank's dump: broadcasts #1..#done completed, #done+1 in flight; the last one created at ``at``."""
    entries = [Entry(record_id=s - 1, pg="0", pg_id=0, seq=s, p2p_seq=0, op="nccl:broadcast",
                     state="completed" if s <= done else "scheduled", completed=s <= done,
                     input_sizes=[[8]], input_dtypes=["Long"], output_sizes=[[8]], is_p2p=False, frames=[],
                     time_created_ns=int((at - (done + 1 - s) * 0.05) * 1e9), timeout_ms=None)
               for s in range(max(1, done - 40), done + 2)]
    return Dump(rank=rank, version="2.10", encoding="pickle",
                pg_config={"0": {"pg_id": "0", "desc": "default_pg", "ranks": list(range(world))}},
                pg_status={"0": {"last_enqueued_collective": done + 1, "last_completed_collective": done}},
                entries=entries)


def _server(world: int = 2, gpus: int = 2) -> Node:
    node = Node([P(10, 1),
                 P(11, 10, torchrun_env(0, world), gpu=0, wchan="hrtimer_nanosleep", vol_per_s=17, cpu_ticks_per_s=20),
                 *(P(11 + r, 10, torchrun_env(r, world), gpu=r % gpus, look="spin", state="R", wchan="0",
                     cpu_ticks_per_s=200) for r in range(1, world))])
    node.run(3)
    for r in range(1, world):
        node.stack(11 + r, BCAST)
    node.run(1)
    return node


def _serve(node: Node, seconds: int, rate: float, done: dict[int, int], every: int = 5) -> None:
    """Run ``seconds``, a dump of each rank every ``every`` s, ``rate`` broadcasts a second between dumps."""
    for i in range(seconds):
        for _ in range(int(node.hz)):
            node.tick()
        if i % every == 0:
            for r in done:
                done[r] += int(rate * every)
                node.pending_fr.append(FrDump(pid=11 + r, rank=r, format="pickle", path=f"/fr/rank_{r}",
                                              dump=_dump(r, done[r], node.t, len(done))))


def _reason(node: Node, pid: int) -> str:
    return next(p["reason"] for p in node.an.processes() if p["pid"] == pid)


def test_collectives_a_flight_recorder_sees_completing_with_no_rank_working_are_an_idle_server():
    node = _server()
    done = {0: 0, 1: 0}
    _serve(node, 40, 15, done)
    for pid in (11, 12):
        assert node.state(pid) == "idle", _reason(node, pid)
        assert _reason(node, pid).startswith("idle server: the collectives with rank 0 keep completing (15 a second)"), \
            _reason(node, pid)
    assert node.kinds() == [], [(i.kind, i.summary) for i in node.an.incidents()]
    # from the second dump on (the first a dump can be compared with), idle and nothing else
    said = [(c.t, c.pid, c.state) for c in node.changes if c.t >= 1010.0 + 2 * node.an.th.dwell_s]
    assert all(st == "idle" for _, _, st in said), said


@pytest.mark.parametrize("world, gpus, every", [(2, 2, 11), (4, 1, 11), (8, 1, 11), (8, 8, 7)],
                         ids=["2_ranks", "4_ranks_one_gpu", "8_ranks_one_gpu", "8_ranks_8_gpus"])
def test_an_idle_server_whose_dumps_come_further_apart_than_a_hang_takes_stays_idle(world, gpus, every):
    # eight schedulers on one GPU each take seconds over a dump (their stacks symbolized), so the
    # dumps that show the broadcasts completing come 7-11 s apart: between two of them nothing else
    # moves for longer than a hang takes. The collectives still complete: an idle server, no page
    node = _server(world, gpus)
    node.stack(11, POLL)  # rank 0's stack: polling its queue (on a shared GPU its spin is the others')
    done = dict.fromkeys(range(world), 0)
    _serve(node, 60, 13, done, every=every)
    assert node.kinds() == [], [(i.kind, i.summary) for i in node.an.incidents()]
    for pid in range(11, 11 + world):
        assert node.state(pid) == "idle", _reason(node, pid)


@pytest.mark.parametrize("world, gpus, every", [(2, 2, 5), (4, 1, 7), (8, 1, 11), (8, 8, 7)],
                         ids=["2_ranks", "4_ranks_one_gpu", "8_ranks_one_gpu", "8_ranks_8_gpus"])
def test_an_idle_server_whose_broadcasts_stop_is_paged_within_a_hangs_time(world, gpus, every):
    # the same servers; then rank 0 never broadcasts again. The dumps that still come show nothing
    # more completing: what the last one before showed holds no longer than until then
    node = _server(world, gpus)
    node.stack(11, POLL)
    done = dict.fromkeys(range(world), 0)
    _serve(node, 30, 13, done, every=every)
    stopped = node.t
    _serve(node, 30, 0, done, every=every)
    assert [i.kind for i in node.an.incidents()] == ["nccl_stall"], [(i.kind, i.summary) for i in node.an.incidents()]
    if gpus > 1:  # on a shared GPU rank 0 reads the others' spin too, until a fresh stack of it comes
        assert node.an.incidents()[0].culprit_ranks == [0], node.an.incidents()[0].summary
    assert node.an.incidents()[0].opened_at - stopped <= node.an.th.hang_gpu_s + 1


def test_collectives_that_stop_completing_are_a_hang_not_an_idle_server():
    # the same server; then rank 0 never broadcasts again (its dumps stop advancing), while it still
    # wakes in its poll loop and rank 1 spins in the broadcast it waits in
    node = _server()
    done = {0: 0, 1: 0}
    _serve(node, 30, 15, done)
    assert node.state(12) == "idle", _reason(node, 12)
    _serve(node, 40, 0, done)
    assert node.state(12) != "idle", _reason(node, 12)
    assert [i.kind for i in node.an.incidents()] == ["nccl_stall"], [(i.kind, i.summary) for i in node.an.incidents()]


def test_dumps_are_asked_for_while_ranks_wait_on_ranks_that_do_no_work_and_not_while_one_works():
    node = _server()
    asked: list[float] = []
    take = node.an.take_requests

    def recording():
        r = take()
        if r.fr_probes:
            asked.append(node.t)
        return r

    node.an.take_requests = recording  # type: ignore[method-assign]
    done = {0: 0, 1: 0}
    _serve(node, 20, 15, done)
    gaps = [b - a for a, b in zip(asked, asked[1:], strict=False)]
    assert len(asked) >= 3 and all(g >= node.an.th.fr_probe_s for g in gaps), asked
    # rank 0 works on its GPU: rank 1 waits for a peer that works, nothing to ask
    node.procs[11].look, node.procs[11].state = "work", "R"
    node.run(3)
    asked.clear()
    _serve(node, 20, 15, done)
    assert not asked, asked


def test_a_flight_recorder_finding_of_dumps_taken_while_the_job_still_worked_names_no_culprit_of_a_later_stall():
    # a probe's dumps catch rank 0 a broadcast ahead of rank 1 (in flight, both fine): "rank 1 never
    # entered broadcast #466". A later stall of the job is judged on dumps taken since it last progressed
    from hangd.analysis.detectors.hang import _of_this_stall
    from hangd.analysis.views import JobTrack
    from hangd.flightrec.analyze import Finding, FindingKind

    node = _server()
    tr = JobTrack()
    f = Finding(kind=FindingKind.MISSING_RANK, pg="0", seq=466, op="nccl:broadcast", ranks=[0], missing_ranks=[1])
    tr.finding_at[(f.kind, f.pg, f.seq)] = 1010.0
    assert _of_this_stall(tr, f, 1009.0, node.an.env)  # dumps since its last progress: this stall's
    assert not _of_this_stall(tr, f, 1030.0, node.an.env)  # the job worked since: not this stall's


def test_a_side_group_that_keeps_completing_says_nothing_of_the_group_a_rank_waits_in():
    # rank 1 waits in broadcast #41 of the default group, which never completes; a health check's
    # all_reduce in another group completes all along: its collectives do not complete
    from hangd.analysis.frjobs import _done

    base = _dump(1, 40, 1000.0)
    side = {"1": {"last_enqueued_collective": 900, "last_completed_collective": 900}}
    before = Dump(rank=1, version="2.10", encoding="pickle", pg_config=base.pg_config,
                  pg_status={**base.pg_status, **side}, entries=base.entries)
    side2 = {"1": {"last_enqueued_collective": 990, "last_completed_collective": 990}}
    after = Dump(rank=1, version="2.10", encoding="pickle", pg_config=base.pg_config,
                 pg_status={**base.pg_status, **side2}, entries=base.entries)
    waits_in = {e.pg for e in after.entries if not e.completed}
    assert waits_in == {"0"}
    assert _done(before, waits_in) == _done(after, waits_in) == 40
    assert _done(after, set()) == 990  # no collective in flight: any group's completions count
