"""A rank killed mid-step (SIGKILL, the OOM killer): no exception, no last log line. Its peers
block in the collective or the store it never joins, asleep, and no stack need come before they
give up seconds later with "Connection reset by peer" and exit too. The one killed first is what
the operator must learn: rank_exited names it within ``rank_exit_wait_s`` of its exit, whatever
the world size, the way the others wait, or whether its parent reaps it at once."""

from __future__ import annotations

import pytest

from .builders import Node, P, torchrun_env

BACKWARD = [("torch/autograd/graph.py", "_engine_run_backward"), ("train.py", "step")]
STORE = [("torch/distributed/elastic/utils/store.py", "barrier"), ("train.py", "main")]


def _job(world: int, gpu: bool) -> Node:
    ranks = [P(11 + r, 10, torchrun_env(r, world), gpu=r if gpu else None, look="work" if gpu else "idle",
               state="R", wchan="0", cpu_ticks_per_s=80, read_per_s=2 << 20, wchar_per_s=2 << 20)
             for r in range(world)]
    node = Node([P(10, 1, cmdline=["python", "launch.py"]), *ranks])
    node.run(6)
    return node


def _kill_and_wait(node: Node, world: int, culprit: int, how: str, zombie: bool, gpu: bool) -> None:
    pid = 11 + culprit
    if zombie:  # its parent reaps it only when it waits on it: a zombie meanwhile, exited all the same
        node.procs[pid].state, node.procs[pid].cpu_ticks_per_s = "Z", 0
        node.procs[pid].read_per_s = node.procs[pid].wchar_per_s = 0
    else:
        node.kill(pid)
    for r in range(world):
        if r == culprit:
            continue
        p = node.procs[11 + r]
        p.read_per_s = p.wchar_per_s = p.cpu_ticks_per_s = 0
        p.state, p.wchan = "S", "futex_do_wait"
        p.look = "spin" if how == "spins" else "idle"
        if how in ("backward", "store"):
            node.stack(11 + r, BACKWARD if how == "backward" else STORE)


def _found_after(world: int, culprit: int, how: str, zombie: bool, gpu: bool, give_up_s: float = 6.0) -> float | None:
    node = _job(world, gpu)
    _kill_and_wait(node, world, culprit, how, zombie, gpu)
    t0 = node.t
    while node.t - t0 < give_up_s:
        node.tick()
        if "rank_exited" in node.kinds():
            (inc,) = node.an.incidents()
            assert inc.culprit_ranks == [culprit], (inc.culprit_ranks, inc.summary)
            return node.t - t0
    return None


@pytest.mark.parametrize("world, culprit, how, zombie, gpu", [
    (2, 1, "asleep", True, False),     # gloo on CPU, no stack after the kill, a zombie a while
    (2, 1, "asleep", False, True),     # NCCL, reaped at once, the GPU idle
    (4, 2, "backward", False, False),  # DDP's all-reduce in backward, on a stack
    (4, 0, "store", True, False),      # rank 0 (the store's host) killed; the others in a store barrier
    (8, 5, "spins", False, True),      # eight ranks, the others spinning in the collective
    (8, 7, "asleep", True, True),
], ids=["2_gloo_zombie", "2_nccl_reaped", "4_backward", "4_store_rank0", "8_spinning", "8_asleep_zombie"])
def test_a_rank_killed_mid_step_is_named_before_its_peers_give_up(world, culprit, how, zombie, gpu):
    at = _found_after(world, culprit, how, zombie, gpu)
    assert at is not None, "no rank_exited in the 6 s before the others give up"
    assert at <= 4.5, at


def test_peers_that_end_their_own_way_after_a_rank_exits_are_no_incident():
    # the others write their last checkpoint and exit: the job ended, it did not lose a rank
    node = _job(4, False)
    node.kill(11 + 3)
    for r in range(3):
        node.procs[11 + r].cpu_ticks_per_s, node.procs[11 + r].wchar_per_s = 40, 200 << 20
    node.run(8)
    for r in range(3):
        node.kill(11 + r)
    node.run(5)
    assert node.kinds() == [], [(i.kind, i.summary) for i in node.an.incidents()]


def test_peers_that_exit_within_seconds_of_the_first_are_a_job_that_ended():
    # the others sleep a moment in their teardown and exit well within rank_exit_wait_s
    node = _job(4, True)
    node.kill(11)
    for r in range(1, 4):
        p = node.procs[11 + r]
        p.read_per_s = p.wchar_per_s = p.cpu_ticks_per_s = 0
        p.state, p.wchan, p.look = "S", "futex_do_wait", "idle"
    node.run(node.an.th.rank_exit_wait_s - 1.5)
    for r in range(1, 4):
        node.kill(11 + r)
    node.run(12)
    assert node.kinds() == [], [(i.kind, i.summary) for i in node.an.incidents()]


@pytest.mark.parametrize("world", [2, 4])
def test_the_incident_keeps_the_last_lines_the_rank_left_wrote_and_where_its_peers_wait(world):
    # the OOM killer's victim logged its last step; its peers' stacks come after the incident opened
    ranks = [P(11 + r, 10, torchrun_env(r, world), gpu=r, look="work", state="R", wchan="0", cpu_ticks_per_s=80,
               log=f"/job/log{r}") for r in range(world)]
    node = Node([P(10, 1, cmdline=["python", "launch.py"]), *ranks])
    culprit = world - 1
    for r in range(world):
        node.write_log(f"/job/log{r}", f"[rank {r}] step 41 loss 0.25\n")
    node.run(6)
    node.write_log(f"/job/log{culprit}", f"[rank {culprit}] step 42: allocating 18.0 GiB for the activations\n")
    node.run(1)
    _kill_and_wait(node, world, culprit, "asleep", False, True)
    node.run(5)
    (inc,) = node.an.incidents()
    assert inc.kind == "rank_exited" and inc.culprit_ranks == [culprit], inc.summary
    assert "allocating 18.0 GiB" in " ".join(inc.evidence["logs"][str(culprit)]), inc.evidence["logs"]
    assert not inc.evidence.get("stacks"), inc.evidence.get("stacks")  # none came before it opened
    node.stack(11, BACKWARD)
    node.run(1)
    (inc,) = node.an.incidents()
    assert "_engine_run_backward" in str(inc.evidence["stacks"]["0"]), inc.evidence["stacks"]


@pytest.mark.parametrize("world", [2, 8])
def test_peers_spinning_for_a_rank_that_left_are_one_incident_until_they_work_again(world):
    # the peers spin in the collective the killed rank never joins: the hang is the exit's, one
    # rank_exited and no nccl_stall beside it; when they work again (an elastic restart of the rank
    # with the same processes) nothing more opens
    node = _job(world, True)
    _kill_and_wait(node, world, world - 1, "spins", False, True)
    node.run(30)
    assert node.kinds() == ["rank_exited"], [(i.kind, i.summary) for i in node.an.incidents()]
    for r in range(world - 1):
        p = node.procs[11 + r]
        p.look, p.state, p.wchan, p.cpu_ticks_per_s = "work", "R", "0", 80
    node.run(15)
    assert node.kinds() == ["rank_exited"], [(i.kind, i.summary) for i in node.an.incidents()]
