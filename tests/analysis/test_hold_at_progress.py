"""A first wait keeps the state the rank was in when it last progressed, not a guess made since.

Captures are seconds apart. A loader whose reads end as it enters a collective that spins a core
(NCCL's lazy communicator set-up in its first barrier does) reads as "on the CPU" until a stack
shows the wait: shown `busy` on that alone, it would stay `busy` through the hold, while it was
loading when the wait began. A state shown since on evidence (a stack, its GPU) stands."""

from __future__ import annotations

import pytest

from hangd.analysis.engine import Analyzer
from hangd.analysis.gather import shown_at_progress
from hangd.analysis.model import Local, State

from .builders import Node, P, torchrun_env

BARRIER = [("torch/distributed/distributed_c10d.py", "barrier"), ("load.py", "main")]
EVENT = [("threading.py", "wait"), ("load.py", "load_shard")]


def _loaders() -> tuple[Node, P, P]:
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, read_per_s=300_000_000, wchan="hrtimer_nanosleep",
           cpu_ticks_per_s=30, dist_threads=["pt_nccl_watchdg"])
    r1 = P(12, 10, torchrun_env(1, 2), gpu=1, read_per_s=300_000_000, wchan="hrtimer_nanosleep",
           cpu_ticks_per_s=30, dist_threads=["pt_nccl_watchdg"])
    node = Node([P(10, 1), r0, r1])
    node.run(10)
    assert node.state(11) == "loading"
    return node, r0, r1


@pytest.mark.parametrize("after_loading, said", [
    ("spins", "loading"),  # a core spent in the barrier's set-up: the guess is undone
    ("gpu", "busy"),  # it trained on its GPU first: shown busy on evidence, that stands
], ids=["spins_a_core", "worked_on_its_gpu"])
def test_a_loader_entering_a_wait_keeps_what_it_last_did(after_loading: str, said: str):
    node, r0, r1 = _loaders()
    # rank 1 stops in its loader, waiting on an event nobody sets, with a timeout in a loop (it wakes:
    # one that never woke would be a hang in hang_stuck_s, test_detectors)
    r1.read_per_s, r1.cpu_ticks_per_s, r1.wchan, r1.vol_per_s = 0, 0, "futex_do_wait", 10
    r0.read_per_s = 0
    if after_loading == "spins":
        r0.state, r0.wchan, r0.cpu_ticks_per_s = "R", "0", 100
        node.run(5)  # the reads have stopped; a core in use, nothing else: a guess, not said yet
        assert node.state(11) == "loading"
        node.run(3)  # ... said once it has held idle_dwell_s
    else:
        r0.look = "work"
        node.run(9)
        r0.look, r0.state, r0.wchan, r0.cpu_ticks_per_s = "idle", "R", "0", 100
        node.run(1)
    assert node.state(11) == "busy"
    node.stack(11, BARRIER)
    node.stack(12, EVENT)
    node.run(3)  # a new state holds for the dwell before it is said
    assert node.state(11) == said
    assert node.kinds() == []  # still a first wait: no hang yet


def _analyzer_with(shown: list[tuple[float, State, Local]], last: float | None) -> Analyzer:
    an = Analyzer()
    p = an._track(7)
    for since, st, loc in shown:
        p.shown.append((since, st, f"{st} then", loc))
    p.state, p.since, p.reason = shown[-1][1], shown[-1][0], f"{shown[-1][1]} then"
    if last is not None:
        an.progress.credit(7, last, "read", strong=True)
    return an


L, B, W, S, Q = State.LOADING, State.BUSY, State.WAITING_PEER, State.STARTING, State.IDLE


@pytest.mark.parametrize("shown, last, kept", [
    ([(10, L, Local.LOADING), (16, B, Local.CPU)], 14, L),  # busy on a core alone: undone
    ([(10, L, Local.LOADING), (16, B, Local.CPU), (17, Q, Local.QUIET)], 14, L),  # and silence
    ([(10, L, Local.LOADING), (16, W, Local.WAITING)], 14, W),  # a stack's wait since: stands
    ([(10, L, Local.LOADING), (15, W, Local.WAITING), (16, B, Local.CPU)], 14, W),  # the guess after it goes
    ([(10, L, Local.LOADING), (16, B, Local.BUSY)], 14, B),  # its GPU since: stands
    ([(5, S, Local.LOADING), (16, B, Local.CPU)], 14, B),  # still setting up then: what it shows now
    ([(10, L, Local.LOADING), (16, B, Local.CPU)], 17, B),  # progressed since: what it shows now
    ([(10, L, Local.LOADING), (16, B, Local.CPU)], None, B),  # never progressed: what it shows now
])
def test_the_state_a_hold_keeps(shown, last, kept):
    an = _analyzer_with(shown, last)
    state, why = shown_at_progress(an.env, 7, 20.0)
    assert state == kept
    assert why.startswith(f"{kept} then")


@pytest.mark.parametrize("stack", [BARRIER, [("torch/distributed/distributed_c10d.py", "_new_process_group_helper"),
                                            ("load.py", "main")]], ids=["barrier", "store"])
@pytest.mark.parametrize("peer_exits", [True, False], ids=["peer_exited", "peer_alive"])
def test_a_wait_for_a_rank_that_exited_is_not_held(stack, peer_exits: bool):
    # two loaders done reading: rank 0 waits in a barrier (or a new group's store handshake), its
    # peer exits early. The rank it pairs with is gone, so the wait is no blip of a step: shown as
    # waiting once its stack shows the wait, not kept `loading` until the hang. With the peer alive
    # (waiting on an event with a timeout, in a loop), the first wait keeps `loading`, as before
    node, r0, r1 = _loaders()
    r0.read_per_s, r0.cpu_ticks_per_s, r0.wchan = 0, 0, "poll_schedule_timeout"
    r1.read_per_s, r1.cpu_ticks_per_s, r1.wchan, r1.vol_per_s = 0, 0, "futex_do_wait", 10
    node.run(2)
    if peer_exits:
        node.kill(12)
    else:
        node.stack(12, EVENT)
    node.run(2)
    node.stack(11, stack)
    node.run(3)  # the dwell
    # with its peer gone and nothing moving since, the exit is judged: rank 0 waits for the one that left
    assert node.state(11) == ("hung" if peer_exits else "loading")
    assert node.kinds() == (["rank_exited"] if peer_exits else [])


@pytest.mark.parametrize("peer_exits", [True, False], ids=["peer_killed", "peer_alive"])
def test_silence_after_a_rank_of_the_job_exited_keeps_the_last_state(peer_exits: bool):
    # a loader done reading sleeps in a poll (the store's socket, its descriptors unread) and its
    # peer is killed: it may wait for that one in a way no stack has shown yet, so it keeps
    # `loading` until a stack shows the wait or the exit is judged (still since the exit for
    # rank_exit_wait_s: rank_exited, and it is hung), not `idle` meanwhile. Both alive and silent,
    # with no wait shown, nothing is held: they idle
    node, r0, r1 = _loaders()
    r0.read_per_s, r0.cpu_ticks_per_s, r0.wchan = 0, 0, "poll_schedule_timeout"
    r1.read_per_s, r1.cpu_ticks_per_s, r1.wchan = 0, 0, "futex_do_wait"
    if peer_exits:
        node.kill(12)
    node.run(node.an.th.rank_exit_wait_s - 1)
    assert node.state(11) == "loading"
    node.run(9)  # past the idle dwell
    assert node.state(11) == ("hung" if peer_exits else "idle")
    assert node.kinds() == (["rank_exited"] if peer_exits else [])


@pytest.mark.parametrize("then", ["gpu", "cpu"])
def test_a_loader_that_moves_on_is_said_busy_on_evidence_at_once_on_a_core_alone_later(then: str):
    # reads end; rank 0 goes on to GPU work (evidence: busy after the dwell) or to a core alone (a
    # guess: its own loop, or a barrier's set-up; busy once that has held idle_dwell_s)
    node, r0, r1 = _loaders()
    r0.read_per_s = r1.read_per_s = 0
    r1.vol_per_s = 10
    r0.state, r0.wchan, r0.cpu_ticks_per_s = "R", "0", 100
    if then == "gpu":
        r0.look = "work"
    node.run(4.5)
    assert node.state(11) == ("busy" if then == "gpu" else "loading")
    node.run(4)
    assert node.state(11) == "busy"
