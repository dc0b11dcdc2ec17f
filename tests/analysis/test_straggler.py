"""A straggler is a rank the others wait for again and again while they still get through their
steps, not a rank that made them wait once (a slow load, a first compile) and then worked with them."""

from __future__ import annotations

import pytest

from .builders import Node, P, torchrun_env


def _pair() -> Node:
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=0, look="work", state="R", cpu_ticks_per_s=100),
                 P(12, 10, torchrun_env(1, 2), gpu=1, look="work", state="R", cpu_ticks_per_s=100)])
    node.run(5)
    return node


def _step(node: Node, fast_works_s: float, waits_s: float) -> None:
    """One training step: both ranks compute, rank 0 finishes first and spins in the all-reduce
    while rank 1 still computes."""
    node.procs[11].look = "work"
    node.run(fast_works_s)
    node.procs[11].look = "spin"
    node.run(waits_s)


def _stragglers(node: Node) -> list[tuple[str, list[int]]]:
    return [(i.kind, i.culprit_ranks) for i in node.an.incidents()]


def test_a_rank_the_others_wait_for_at_every_step_is_a_straggler():
    node = _pair()
    for _ in range(12):
        _step(node, 1, 2)  # rank 1 takes 3 s a step, rank 0 1 s and waits 2
    assert _stragglers(node) == [("straggler", [1])], [(i.kind, i.summary) for i in node.an.incidents()]
    (inc,) = node.an.incidents()
    assert inc.summary.startswith("rank 1 kept rank 0 waiting in collectives for "), inc.summary


def test_a_rank_that_made_the_others_wait_once_and_then_worked_with_them_is_no_straggler():
    # rank 1 loads for 25 s (its own work) while rank 0 sits in the barrier after its own load;
    # then both train in step, none waiting on the other longer than a sample
    node = _pair()
    _step(node, 0, 25)
    node.procs[11].look = "work"
    node.run(40)
    assert _stragglers(node) == [], [(i.kind, i.summary) for i in node.an.incidents()]


def test_waits_that_end_in_a_hang_are_the_hang_s_not_a_straggler_s():
    node = _pair()
    _step(node, 1, 2)
    node.procs[11].look = "spin"
    node.procs[12].look, node.procs[12].state, node.procs[12].cpu_ticks_per_s = "idle", "S", 0
    node.run(60)
    assert [k for k, _ in _stragglers(node)] == ["nccl_stall"], [(i.kind, i.summary) for i in node.an.incidents()]


def test_a_rank_still_starting_while_its_peer_waits_in_the_rendezvous_is_no_straggler():
    # rank 0 is up and waits in the start-up's rendezvous store for rank 1, still importing on a
    # core: rank 0 waits for the job to form, not in a collective for rank 1
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), wchan="futex_do_wait", dist_threads=["gloo"]),
                 P(12, 10, torchrun_env(1, 2), state="R", cpu_ticks_per_s=100, dist_threads=["gloo"])])
    node.run(2)
    node.stack(11, [("torch/distributed/rendezvous.py", "_create_c10d_store"), ("train.py", "main")])
    node.run(10)  # within hang_host_s: a start-up this silent for longer is a hang of its own
    said = {c.state for c in node.changes if c.pid == 12}
    assert "straggler" not in said, [(c.t, c.state, c.reason) for c in node.changes if c.pid == 12]
    assert _stragglers(node) == [], [(i.kind, i.summary) for i in node.an.incidents()]


DATALOADER = [("multiprocessing/connection.py", "wait", 1136), ("torch/utils/data/dataloader.py", "_try_get_data", 1133),
              ("train.py", "main", 40)]


def _data_bound(worker_cpu: int) -> Node:
    """Rank 1 waits on its DataLoader worker (pid 13) between steps; rank 0, on the other GPU,
    spins in the all_reduce meanwhile. The worker works (``worker_cpu`` ticks a second) or not."""
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=0, look="work", state="R", cpu_ticks_per_s=100),
                 P(12, 10, torchrun_env(1, 2), gpu=1, look="work", state="R", cpu_ticks_per_s=100),
                 P(13, 12, cmdline=["python", "train.py"], role="child", cpu_ticks_per_s=worker_cpu,
                   state="R" if worker_cpu else "S")])
    node.run(5)
    return node


def _wait_on_worker(node: Node, seconds: float) -> None:
    node.procs[11].look = "spin"
    node.procs[12].look, node.procs[12].state, node.procs[12].cpu_ticks_per_s = "idle", "S", 0
    node.stack(12, DATALOADER)
    node.run(seconds)


def _data_steps(node: Node, steps: int, waits_s: float) -> None:
    """Steps of 1 s of work on both ranks, then rank 0 waits ``waits_s`` for rank 1's batch."""
    for _ in range(steps):
        node.procs[11].look = "work"
        node.procs[12].look, node.procs[12].state, node.procs[12].cpu_ticks_per_s = "work", "R", 100
        node.run(1)
        _wait_on_worker(node, waits_s)


def test_a_rank_slow_on_working_data_workers_is_a_straggler():
    # the culprit waits on workers that work: slow data, the others wait at every step
    node = _data_bound(worker_cpu=100)
    _data_steps(node, 12, waits_s=2)
    assert ("straggler", [1]) in _stragglers(node), [(i.kind, i.summary) for i in node.an.incidents()]


def test_a_rank_whose_data_worker_blocked_is_a_hang_not_a_straggler():
    # a few steps where rank 0 waits a moment for rank 1's data, then rank 1's worker blocks: rank
    # 0 waits on and on while rank 1 sits on a worker that does nothing. The waits add up past
    # the straggler's bar before the hang is judged: one event, one incident, the hang
    node = _data_bound(worker_cpu=100)
    _data_steps(node, 4, waits_s=1)
    node.procs[13].cpu_ticks_per_s, node.procs[13].state = 0, "S"
    _wait_on_worker(node, 40)
    kinds = [k for k, _ in _stragglers(node)]
    assert "straggler" not in kinds and kinds, [(i.kind, i.summary) for i in node.an.incidents()]


@pytest.mark.parametrize("short_waits, straggler", [(1, False), (6, True)], ids=["one_short_wait", "short_waits_recur"])
def test_one_long_wait_then_short_ones_is_a_straggler_only_if_they_recur(short_waits, straggler):
    # rank 1 loads for 25 s while rank 0 waits in the barrier, then they train; rank 0 waits 2 s
    # for rank 1 at one step (a phase and a blip: no pattern), or at step after step (a straggler)
    node = _pair()
    _step(node, 0, 25)
    for _ in range(short_waits):
        node.procs[11].look = "work"
        node.run(3)
        _step(node, 0, 2)
    node.procs[11].look = "work"
    node.run(20)
    assert (("straggler", [1]) in _stragglers(node)) is straggler, [(i.kind, i.summary) for i in node.an.incidents()]



POOL = [("concurrent/futures/_base.py", "Future.result", 449), ("train.py", "preprocess", 52), ("train.py", "main", 40)]


def test_a_rank_slow_on_a_thread_of_its_own_that_works_is_a_straggler():
    """Rank 1 does its step's work in a thread pool, its main thread asleep on the future all the
    while (the process burns a core); rank 0 works a second each step, then waits two for rank 1.
    A thread at work is slow work, as a working DataLoader worker is: a straggler, not a rank
    that "runs no more"."""
    node = _pair()
    r0, r1 = node.procs[11], node.procs[12]
    r1.look, r1.state, r1.wchan, r1.cpu_ticks_per_s = "idle", "S", "futex_do_wait", 100
    for _ in range(12):
        r0.look = "work"
        node.stack(12, POOL)
        node.run(1)
        r0.look = "spin"
        node.run(2)
    assert ("straggler", [1]) in _stragglers(node), [(i.kind, i.summary) for i in node.an.incidents()]


def test_a_rank_kept_waiting_step_after_step_is_said_to_wait():
    """Waits that recur are a pattern, not a hang's first seconds: the rank kept waiting is shown
    `waiting_peer` in them, not held at its work (a wait every rank is in is held: each rank's own
    collectives, a moment each)."""
    node = _pair()
    said = []
    for _ in range(10):
        _step(node, 1, 3)
        said.append(node.state(11))
    assert said[-4:] == ["waiting_peer"] * 4, said


def _ranks(world: int) -> Node:
    node = Node([P(10, 1)] + [P(11 + r, 10, torchrun_env(r, world), gpu=r, look="work", state="R", cpu_ticks_per_s=100)
                              for r in range(world)])
    node.run(5)
    return node


def _turns(node: Node, world: int, slow_of_step: list[set[int]]) -> None:
    """Steps in which the ranks ``slow_of_step[k]`` compute 3 s and the rest 1 s, then wait 2 s
    spinning in the all-reduce for them."""
    for slow in slow_of_step:
        for r in range(world):
            node.procs[11 + r].look = "work"
        node.run(1)
        for r in range(world):
            if r not in slow:
                node.procs[11 + r].look = "spin"
        node.run(2)


@pytest.mark.parametrize("world", [4, 8])
def test_ranks_taking_turns_on_a_shared_resource_are_no_stragglers(world: int):
    # ranks sharing a GPU (or a link) take turns on it: at each step another half of them runs
    # late, so each keeps the others waiting a while, none more than the rest (seen: 8 FSDP2 ranks
    # on one GPU, four of them named stragglers). No straggler; one rank late every step is one
    node = _ranks(world)
    half = world // 2
    _turns(node, world, [{(k + i) % world for i in range(half)} for k in range(20)])
    assert _stragglers(node) == [], [(i.kind, i.summary) for i in node.an.incidents()]


@pytest.mark.parametrize("world, slow", [(4, 2), (8, 5)])
def test_one_rank_late_at_every_step_of_many_is_the_straggler(world: int, slow: int):
    node = _ranks(world)
    _turns(node, world, [{slow}] * 20)
    assert _stragglers(node) == [("straggler", [slow])], [(i.kind, i.summary) for i in node.an.incidents()]
