"""A rank stopped by a signal or a debugger (state T) runs no code until it is continued, and is
said ``hung`` at once. The ranks that wait for it in a collective cannot go on either: they are
``hung`` at once too, naming the stopped rank, not ``waiting_peer`` for the seconds until the hang
threshold (matrix-cpu torchrun-warmup-sigstop-collective-w4: three ranks of a warm-up shown
``waiting_peer`` while rank 3 was stopped). The incident still opens at its threshold, once, with
the stopped rank as its culprit. A rank that waits for a peer that is only asleep keeps the usual
first-wait states."""

from __future__ import annotations

import pytest

from hangd.analysis.thresholds import Thresholds

from .builders import ON_CPU, Node, P, torchrun_env

TH = Thresholds()
NCCL = ["pt_nccl_watchdg", "NCCL ncclProxy"]
GLOO = ["pt_gloo_runloop"]
ALL_REDUCE = [("torch/distributed/distributed_c10d.py", "all_reduce", 3068), ("train.py", "step", 40),
              ("train.py", "main", 80)]
ASLEEP = [("threading.py", "wait", 359), ("train.py", "main", 81)]


def _job(world: int, threads: list[str]) -> tuple[Node, list[P]]:
    ranks = [P(11 + r, 10, torchrun_env(r, world), gpu=0, gpu_mem=1200 << 20, look="work", dist_threads=threads,
               **ON_CPU) for r in range(world)]  # type: ignore[arg-type]
    node = Node([P(10, 1), *ranks])
    node.run(12)
    return node, ranks


def _wait(node: Node, ranks: list[P], culprit: P, how: str, threads: list[str]) -> None:
    """Every rank but ``culprit`` waits in an all_reduce from now: spinning on its GPU (NCCL) or
    asleep host-side (gloo); their stacks show it 1 s in."""
    for r in ranks:
        if r is culprit:
            continue
        if how == "spin":
            r.look = "spin"
        else:
            r.look, r.state, r.cpu_ticks_per_s, r.wchan = "idle", "S", 0, "futex_wait_queue"
    node.run(1)
    for r in ranks:
        if r is not culprit:
            node.stack(r.pid, ALL_REDUCE, threads=threads)


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize(("how", "threads"), [("spin", NCCL), ("host", GLOO)])
@pytest.mark.parametrize("which", ["last", "first"])
def test_ranks_waiting_for_a_stopped_rank_are_hung_at_once(world: int, how: str, threads: list[str], which: str):
    node, ranks = _job(world, threads)
    culprit = ranks[-1] if which == "last" else ranks[0]
    culprit.state, culprit.cpu_ticks_per_s, culprit.look = "T", 0, "idle"
    _wait(node, ranks, culprit, how, threads)
    node.run(1)
    assert node.kinds() == [], node.kinds()  # before the incident: the states say it already
    waiters = [r for r in ranks if r is not culprit]
    assert {node.state(r.pid) for r in ranks} == {"hung"}, [(r.pid, node.state(r.pid)) for r in ranks]
    rank = ranks.index(culprit)
    assert all(f"rank {rank} it waits for is stopped" in node.an._track(r.pid).reason for r in waiters), \
        [node.an._track(r.pid).reason for r in waiters]
    node.run(TH.hang_all_in_s + 4)
    hangs = [i for i in node.an.incidents() if i.kind in ("nccl_stall", "host_stall")]
    assert [i.culprit_ranks for i in hangs] == [[rank]], [(i.kind, i.culprit_ranks, i.summary) for i in hangs]


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_waiting_for_an_asleep_rank_are_not_hung_before_the_threshold(world: int):
    node, ranks = _job(world, GLOO)
    culprit = ranks[-1]
    culprit.state, culprit.cpu_ticks_per_s, culprit.wchan, culprit.look = "S", 0, "futex_do_wait", "idle"
    _wait(node, ranks, culprit, "host", GLOO)
    node.stack(culprit.pid, ASLEEP)
    node.run(TH.dwell_s + 1)
    assert node.kinds() == [], node.kinds()
    assert all(node.state(r.pid) != "hung" for r in ranks), [(r.pid, node.state(r.pid)) for r in ranks]
