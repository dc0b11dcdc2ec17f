"""What a rank that starts waiting for a peer is said to be, by what the rank it waits for does.

A rank that starts waiting for a peer keeps its state through a first wait (the "hold" row) unless
the peer it waits for works: then it waits for a peer that works, waiting_peer at once. A peer that
wrote one last log line and then fell asleep, or sits blocked on a worker of its own that sleeps,
is not working: the wait is held, as the first seconds of a hang are. A peer that waits for input
from outside the job makes it an idle server's rank: idle once the dwell has passed, as the server
itself is (not after the longer dwell of a rank gone quiet for no known reason)."""

from __future__ import annotations

import pytest

from hangd.snapshot import FdWait, Frame, StackSample, ThreadStack

from .builders import Node, P, torchrun_env

COLL = [("torch/distributed/distributed_c10d.py", "all_reduce"), ("train.py", "step")]

ASLEEP = dict(wchan="hrtimer_nanosleep")
ON_ITS_WORKER = dict(wchan="poll_schedule_timeout", wait_syscall="pselect6",
                     fd_waits=[FdWait(fd=9, kind="pipe", holders=[11, 13])])
ON_CPU = dict(state="R", wchan="0", cpu_ticks_per_s=95)


def _training(extra_procs: tuple[P, ...] = ()) -> tuple[Node, P, P]:
    """Two ranks (and the launcher, and any extra processes) after 12 s of training: both work on
    their GPUs and log each second. Returns the node, rank 0 and rank 1."""
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, look="work", log="/job/log0", dist_threads=["pt_nccl_watchdg"])
    r1 = P(12, 10, torchrun_env(1, 2), gpu=1, look="work", log="/job/log1", dist_threads=["pt_nccl_watchdg"])
    node = Node([P(10, 1), r0, r1, *extra_procs])
    for _ in range(12):
        node.write_log("/job/log0", "step\n")
        node.write_log("/job/log1", "step\n")
        node.run(1)
    return node, r0, r1


@pytest.mark.parametrize("after_its_log_line, said", [
    (ASLEEP, "busy"),  # asleep in its own code: a first wait, held
    (ON_ITS_WORKER, "busy"),  # blocked on its own worker, which sleeps: held too
    (ON_CPU, "waiting_peer"),  # working on the CPU: they wait for a peer that works
    (dict(look="work"), "waiting_peer"),  # back at work on its GPU: the same
], ids=["asleep", "on_its_sleeping_worker", "on_cpu", "on_its_gpu"])
def test_a_first_wait_for_a_rank_that_only_logged_is_held(after_its_log_line: dict, said: str):
    worker = P(13, 11, cmdline=["python", "-c", "worker"], wchan="hrtimer_nanosleep")
    node, r0, r1 = _training((worker,))
    assert node.state(12) == "busy"
    # rank 0 stops; rank 1 waits for it in a collective
    r0.look = r1.look = "idle"
    node.stack(12, COLL)
    node.run(1.5)
    # rank 0 writes one line (the request it is stuck on), then does what the case says
    node.write_log("/job/log0", "handling request 7\n")
    r0.wchar_per_s = 80  # the line's bytes, written in this tick
    for k, v in after_its_log_line.items():
        setattr(r0, k, v)
    node.run(0.25)
    r0.wchar_per_s = 0
    node.run(3.25)
    assert node.state(12) == said


ACCEPT = [("socket.py", "accept"), ("server.py", "serve")]
LISTENING = [FdWait(fd=4, kind="tcp", listening=True, local="0.0.0.0:8000")]


@pytest.mark.parametrize("coordinator, said", [
    (dict(wchan="inet_csk_accept", wait_syscall="accept4", fd_waits=LISTENING), "idle"),  # waits for requests
    (dict(wchan="hrtimer_nanosleep"), "busy"),  # asleep in its own code: a first wait, held
], ids=["accepting", "asleep"])
def test_the_rank_of_an_idle_server_is_idle_after_the_dwell(coordinator: dict, said: str):
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, look="work", dist_threads=["pt_nccl_watchdg"])
    r1 = P(12, 10, torchrun_env(1, 2), gpu=1, look="work", dist_threads=["pt_nccl_watchdg"])
    node = Node([P(10, 1), r0, r1])
    node.run(12)  # a batch: both work on their GPUs
    assert node.state(12) == "busy"
    r0.look = r1.look = "idle"
    for k, v in coordinator.items():
        setattr(r0, k, v)
    node.stack(12, COLL)
    node.run(3.5)
    assert node.state(12) == said


@pytest.mark.parametrize("peer_works_on_s, said", [
    (3, "waiting_peer"),  # the peer worked on while it sat quiet: it waited for a peer that works
    (0, "busy"),  # both stopped at once: a first wait, held (the first seconds of a hang)
], ids=["peer_worked_meanwhile", "both_stopped"])
def test_a_wait_is_dated_from_the_waiting_rank_s_last_progress_not_from_its_stack(peer_works_on_s: int, said: str):
    """A stack shows a wait seconds after it began (captures are seconds apart): what the peer did
    in between counts as done while the rank waited."""
    node, r0, r1 = _training()
    r1.look = "idle"  # rank 1 waits; no stack has shown it yet
    node.run(peer_works_on_s)
    r0.look, r0.wchan = "idle", "hrtimer_nanosleep"  # rank 0 stops too
    node.run(1)
    node.stack(12, [("torch/distributed/distributed_c10d.py", "barrier"), ("train.py", "save")])
    node.run(3)
    assert node.state(12) == said


@pytest.mark.parametrize("world", [2, 4])
def test_a_wait_every_rank_is_in_is_held_though_such_waits_recur(world: int):
    """Every rank spins in a collective (one skipped a step: each waits in a different one). Such
    all-rank waits recur in healthy training, a moment each step; one that lasts has no peer at
    work to wait for: the ranks keep their state until the job is judged hung."""
    ranks = [P(11 + r, 10, torchrun_env(r, world), gpu=r, look="work", dist_threads=["pt_nccl_watchdg"])
             for r in range(world)]
    node = Node([P(10, 1), *ranks])
    node.run(6)
    # the one that skipped a step waits at the next all_reduce: another line of the step
    skipped = [COLL[0], ("train.py", "step", 9)]
    for _ in range(3):  # three waits of all ranks in the step's all_reduce, seconds each (slow transport)
        for r in ranks:
            r.look = "spin"
            node.stack(r.pid, COLL if r is not ranks[-1] else skipped)
        node.run(2.5)
        for r in ranks:
            r.look = "work"
        node.run(5)
    assert [node.state(r.pid) for r in ranks] == ["busy"] * world
    for r in ranks:
        r.look = "spin"
        node.stack(r.pid, COLL if r is not ranks[-1] else skipped)
    node.run(8)  # past the dwell, short of the hang threshold
    assert [node.state(r.pid) for r in ranks] == ["busy"] * world
    node.run(6)
    assert [node.state(r.pid) for r in ranks] == ["hung"] * world
    assert "nccl_stall" in node.kinds()


QUEUE_GET = [("threading.py", "Condition.wait"), ("queue.py", "Queue.get"), ("server.py", "schedule")]
LISTENER = [("socket.py", "socket.accept"), ("server.py", "listen"), ("threading.py", "Thread.run")]


@pytest.mark.parametrize("caught_running", [False, True], ids=["always_asleep", "caught_running_now_and_then"])
def test_a_polling_server_caught_running_between_two_sleeps_still_waits_for_requests(caught_running: bool):
    """A scheduler that wakes 20 times a second to poll its request queue is caught running (state
    R, no wait point) by some samples: it has not left the wait its stack showed (seen on an H200:
    each such sample restarted the dwell, and the idle server's ranks read busy 10 s too long)."""
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, look="work", dist_threads=["pt_nccl_watchdg"])
    r1 = P(12, 10, torchrun_env(1, 2), gpu=1, look="work", dist_threads=["pt_nccl_watchdg"])
    node = Node([P(10, 1), r0, r1])
    node.run(12)
    r0.look = r1.look = "idle"
    r0.cpu_ticks_per_s = 10  # a tenth of a core: the polls
    node.pending_stacks.append(StackSample(pid=11, threads=[
        ThreadStack(tid=11, name="MainThread", active=False, owns_gil=False,
                    frames=[Frame(name=n, filename=f, line=1) for f, n in QUEUE_GET]),
        ThreadStack(tid=13, name="listener", active=False, owns_gil=False,
                    frames=[Frame(name=n, filename=f, line=1) for f, n in LISTENER])]))
    node.stack(12, COLL)
    for _ in range(6):
        node.run(0.75)
        if caught_running:
            r0.state, r0.wchan = "R", "0"
        node.run(0.25)
        r0.state, r0.wchan = "S", "futex_do_wait"
    assert (node.state(11), node.state(12)) == ("idle", "idle"), node.an.processes()


def test_a_server_that_left_its_wait_for_the_cpu_is_not_read_by_the_old_stack():
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, look="work", dist_threads=["pt_nccl_watchdg"])
    r1 = P(12, 10, torchrun_env(1, 2), gpu=1, look="work", dist_threads=["pt_nccl_watchdg"])
    node = Node([P(10, 1), r0, r1])
    node.run(12)
    r0.look = r1.look = "idle"
    node.pending_stacks.append(StackSample(pid=11, threads=[
        ThreadStack(tid=11, name="MainThread", active=False, owns_gil=False,
                    frames=[Frame(name=n, filename=f, line=1) for f, n in QUEUE_GET]),
        ThreadStack(tid=13, name="listener", active=False, owns_gil=False,
                    frames=[Frame(name=n, filename=f, line=1) for f, n in LISTENER])]))
    node.run(1)
    r0.state, r0.wchan, r0.cpu_ticks_per_s = "R", "0", 95  # a request came in: it runs on the CPU
    node.run(4)
    assert node.state(11) != "idle", node.an.processes()


@pytest.mark.parametrize("peer_works_on_s, then, said", [
    (4, dict(look="idle", wchan="hrtimer_nanosleep"), "waiting_peer"),  # writes on, then sleeps forever
    (4, dict(look="idle", state="R", wchan="0", cpu_ticks_per_s=95), "waiting_peer"),  # ... or spins a core
    (0.5, dict(look="idle", wchan="hrtimer_nanosleep"), "busy"),  # stopped with it: a hang's first moment, held
], ids=["peer_worked_then_sleeps", "peer_worked_then_spins", "peer_stopped_with_it"])
def test_a_wait_that_began_while_the_peer_worked_stays_a_wait_when_the_peer_stops(peer_works_on_s: float, then: dict,
                                                                                  said: str):
    """Rank 1 enters a barrier while rank 0 still writes a checkpoint; rank 0 then stops in its own
    code. The stack that shows rank 1's wait comes after rank 0's last progress is no longer recent
    (captures are seconds apart): rank 1 waited for rank 0's work, and still waits for rank 0. Rank 0
    keeps what it did (a hang's first seconds), not straggler."""
    node, r0, r1 = _training()
    r1.look, r1.wchan = "idle", "futex_do_wait"  # rank 1 waits in the barrier; no stack shows it yet
    r0.look, r0.wchar_per_s = "idle", 80_000_000  # rank 0 writes its checkpoint
    node.run(peer_works_on_s)
    r0.wchar_per_s = 0
    for k, v in then.items():
        setattr(r0, k, v)
    node.run(6)  # rank 0's last progress is past progress_recent_s when the stack comes
    node.stack(12, [("torch/distributed/distributed_c10d.py", "barrier"), ("train.py", "save")])
    node.run(3)
    assert node.state(12) == said, node.an.processes()
    assert node.state(11) == "busy", node.an.processes()
