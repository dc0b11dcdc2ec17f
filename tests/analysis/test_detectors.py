"""Incident families on hand-made nodes: what pages and what must not."""

from __future__ import annotations

import pytest

from hangd.analysis.thresholds import Thresholds

from .builders import GiB, Node, P, churn, torchrun_env

COLL = [("torch/distributed/distributed_c10d.py", "broadcast_object_list"), ("server.py", "loop")]
EVENT = [("threading.py", "wait"), ("server.py", "start")]
ACCEPT = [("socket.py", "accept"), ("server.py", "serve")]


def two_ranks(**kw) -> list[P]:
    return [P(11, 10, torchrun_env(0, 2), gpu=0, log="/job/log0", **kw), P(12, 10, torchrun_env(1, 2), gpu=1, log="/job/log1", **kw)]


def hang_node(**kw) -> Node:
    """rank 0 blocked host-side in a broadcast, rank 1 waiting on an event: the seed's shape."""
    node = Node([P(10, 1), *two_ranks(**kw)])
    node.run(5)
    return node


def stacks(node: Node) -> None:
    node.stack(11, COLL)
    node.stack(12, EVENT)


def test_a_lone_sleeping_process_is_idle_not_hung():
    node = Node([P(5, 1, {}, cmdline=["python", "app.py"], gpu=0, gpu_mem=600 << 20)])
    node.run(10)
    node.stack(5, EVENT)
    node.run(40)
    assert node.kinds() == []
    assert node.state(5) == "idle"


def test_host_side_hang_names_the_rank_the_others_wait_for():
    node = hang_node()
    stacks(node)
    node.run(15)
    (inc,) = node.an.incidents()
    assert inc.kind == "host_stall" and inc.culprit_ranks == [1]


def test_the_culprit_stays_when_the_stacks_go_stale():
    node = hang_node()
    stacks(node)
    node.run(15)
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [1]
    node.procs[11].wchan = "futex_wait_queue"  # stacks no longer describe rank 0's wait point
    node.run(20)
    assert inc.culprit_ranks == [1] and "no culprit" not in inc.summary
    assert inc.open


def test_an_idle_server_whose_coordinator_waits_for_requests_raises_nothing():
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=0, wchan="inet_csk_accept"),
                 P(12, 10, torchrun_env(1, 2), gpu=1, look="spin", state="R", cpu_ticks_per_s=100)])
    node.run(5)
    node.stack(11, ACCEPT)
    node.stack(12, COLL)
    node.run(120)
    assert node.kinds() == []
    assert node.state(11) == "idle" and node.state(12) == "idle"


def test_collectives_that_keep_completing_are_not_a_hang():
    """A server that polls an empty queue and broadcasts an empty batch 20 times a second."""
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), vol_per_s=20), P(12, 10, torchrun_env(1, 2), vol_per_s=20)])
    node.run(5)
    node.stack(11, COLL)
    node.stack(12, COLL)
    node.run(60)
    assert node.kinds() == []


def test_a_shared_log_written_by_someone_else_does_not_end_a_hang():
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=0, log="/job/nohup.out"),
                 P(12, 10, torchrun_env(1, 2), gpu=1, log="/job/nohup.out")])
    node.run(5)
    stacks(node)
    node.run(15)
    (inc,) = node.an.incidents()
    for _ in range(80):  # another process appends to the same file every tick
        node.write_log("/job/nohup.out", "[monitor] still here\n")
        node.tick()
    assert inc.open and node.kinds() == ["host_stall"], [i.timeline for i in node.an.incidents()]


def test_its_own_log_growing_is_progress():
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=0, log="/job/log0"),
                 P(12, 10, torchrun_env(1, 2), gpu=1, log="/job/log1")])
    node.run(5)
    stacks(node)
    node.run(15)
    (inc,) = node.an.incidents()
    node.procs[12].wchar_per_s = 400
    node.procs[11].vol_per_s = 50  # the collective rank 0 waited in completes: it wakes, step after step
    for _ in range(20):
        node.write_log("/job/log1", "step 1234 loss 0.1\n")
        node.procs[12].look = "work"
        node.tick()
    assert not inc.open


def test_a_slow_reader_its_peer_waits_for_is_loading_not_hung():
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=0),
                 P(12, 10, torchrun_env(1, 2), gpu=1, wchan="hrtimer_nanosleep", read_per_s=130_000_000,
                   cpu_ticks_per_s=10)])
    node.run(5)
    node.stack(11, [("torch/distributed/distributed_c10d.py", "barrier"), ("load.py", "main")])
    node.run(60)
    assert not [k for k in node.kinds() if k in ("host_stall", "nccl_stall", "io_stall")], node.kinds()
    assert node.state(12) == "loading"


def test_the_summary_quotes_the_exception_in_the_rank_log():
    node = Node([P(10, 1), *two_ranks()])
    node.run(5)
    node.write_log("/job/log1", "Traceback (most recent call last):\n  File \"w.py\", line 3, in run\n"
                   "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x4096 and 7168x4096)\n")
    node.tick()
    node.procs[12].threads = 11  # the worker thread died
    stacks(node)
    node.run(15)
    (inc,) = node.an.incidents()
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x4096 and 7168x4096)" in inc.summary
    assert "rank 1's log" in inc.summary
    assert "lost a thread" in inc.summary
    assert "TORCH_FR_BUFFER_SIZE" in inc.next_step  # flight recording is off for this job


def test_a_clean_end_is_not_rank_exited_and_a_dead_rank_is_reported_once():
    node = Node([P(10, 1), *two_ranks(look="work")])
    node.run(5)
    node.kill(11)
    node.kill(12)
    node.run(20)
    assert node.kinds() == []
    node2 = Node([P(10, 1), *two_ranks(look="work")])
    node2.run(5)
    node2.kill(12)
    node2.procs[11].look = "spin"
    node2.run(40)
    assert node2.kinds() == ["rank_exited"]
    (inc,) = node2.an.incidents()
    assert inc.culprit_ranks == [1]


def test_a_rank_that_exits_while_its_peer_keeps_working_is_not_rank_exited():
    node = Node([P(10, 1), *two_ranks(look="work")])
    node.run(5)
    node.kill(12)
    node.run(30)  # rank 0 keeps working (saving a checkpoint, its last steps)
    assert node.kinds() == []


def _exit_seconds(after_exit: str, waits_since_s: float = 0.0) -> float | None:
    """Seconds from rank 1's exit to a rank_exited incident (up to 20 s), rank 0 doing
    ``after_exit``: spinning on its GPU in a collective or blocked host-side in one (its stack)."""
    node = Node([P(10, 1), *two_ranks(look="work")])
    node.run(5)
    node.kill(12)
    node.run(waits_since_s)  # it works on a while first (its last kernels)
    if after_exit == "spins":
        node.procs[11].look = "spin"
    else:
        node.procs[11].look = "idle"
        node.stack(11, COLL)
    for k in range(int(20 * node.hz)):
        node.tick()
        if "rank_exited" in node.kinds():
            return k / node.hz + waits_since_s
    return None


@pytest.mark.parametrize("after_exit", ["spins", "blocked"])
def test_a_rank_left_waiting_for_one_that_exited_is_reported_within_seconds(after_exit: str):
    """NCCL waits for a peer that left until its timeout: a rank left alone waiting in a collective
    needs no 10 s grace to be told from a job that ended, only the seconds a wait needs to hold."""
    at = _exit_seconds(after_exit)
    assert at is not None and at <= 6.0, at
    later = _exit_seconds(after_exit, waits_since_s=2.0)
    assert later is not None and later <= 8.0, later


def test_memory_stays_bounded_under_job_churn():
    """A new short job every few seconds for a long while: what the analysis holds stays bounded,
    gone processes leave the views, and what was dropped is counted."""
    from hangd.analysis.engine import Analyzer
    from hangd.analysis.thresholds import Thresholds

    an = Analyzer(Thresholds(gone_after_s=10.0, max_changes_in_memory=200, serve_job_quiet_s=10.0))
    node = Node([], analyzer=an)
    churn(node, 60)
    assert len(an.tracks) <= 10 and len(an.job_tracks) <= 5, (len(an.tracks), len(an.job_tracks))
    assert len(an.view.procs) <= 10
    assert len(an.changes) <= 200
    assert not [p for p in an.processes() if p["state"] != "gone"]
    assert an.forgotten()["processes"] >= 100 and an.forgotten()["changes"] > 0  # 120 ranks came and went


def _hang_opened_after(with_exception: bool, wakes_per_s: int = 0, culprit_stack=EVENT, child_cpu: int = 0,
                       wake_after_stack_s: float | None = None) -> float | None:
    """Seconds from the last progress to the hang incident, up to 30 s: rank 0 waits in a broadcast
    for rank 1, which waits in ``culprit_stack``, its main thread woken ``wakes_per_s`` times a
    second (a timed wait wakes, one with no timeout does not), with a child on ``child_cpu`` ticks
    a second, and woken once ``wake_after_stack_s`` after its stack was taken."""
    kid = P(13, 12, cmdline=["python", "-c", "from multiprocessing.spawn import spawn_main"],
            cpu_ticks_per_s=child_cpu, role="child")
    node = Node([P(10, 1), *two_ranks(look="work"), kid])
    node.write_log("/job/log1", "rank 1 ready\n")
    node.run(5)
    for pid in (11, 12):  # the GPUs go still
        node.procs[pid].look = "idle"
    node.procs[12].vol_per_s = wakes_per_s
    if with_exception:
        node.write_log("/job/log1", "Traceback (most recent call last):\n  File \"w.py\", line 3, in run\n"
                       "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x4096 and 7168x4096)\n")
    else:
        node.write_log("/job/log1", "step 100 loss 1.25\n")
    node.tick()
    t0 = node.t
    node.stack(11, COLL)
    node.stack(12, culprit_stack)
    while node.t - t0 < 30:
        node.tick()
        if wake_after_stack_s is not None:
            woke = abs(node.t - t0 - wake_after_stack_s) < 0.2
            node.procs[12].vol_per_s = 8 if woke else 0
        if node.kinds():
            return node.t - t0
    return None


WORKER_WAIT = [("concurrent/futures/_base.py", "result"), ("w.py", "run")]


def test_ranks_waiting_since_an_exception_hang_sooner_than_a_plain_wait():
    # the same silence with an exception in a rank's log as it went still is a hang in seconds;
    # without it the job waits the full host-side threshold (a slow step must not page)
    soon, plain = _hang_opened_after(True, wakes_per_s=10), _hang_opened_after(False, wakes_per_s=10)
    assert soon is not None and plain is not None
    assert soon <= 6.0 < 11.0 <= plain, (soon, plain)


@pytest.mark.parametrize("stack", [EVENT, WORKER_WAIT], ids=["event", "own_worker"])
def test_a_culprit_in_a_wait_no_timeout_ends_is_a_hang_sooner_than_a_timed_wait(stack):
    # the culprit blocked in a wait of its own whose main thread never wakes (an Event.wait() or a
    # future's result() with no timeout) cannot be a slow step: nothing of the job moves to end it
    stuck = _hang_opened_after(False, culprit_stack=stack)
    timed = _hang_opened_after(False, wakes_per_s=10, culprit_stack=stack)  # wait(timeout=0.1) in a loop
    assert stuck is not None and timed is not None
    assert 5.0 <= stuck <= 8.0 < 11.0 <= timed, (stuck, timed)


def test_a_wait_whose_worker_works_or_that_woke_since_its_stack_is_not_hung_sooner():
    # the worker it waits on works on the CPU: the wait ends when that work does
    worked = _hang_opened_after(False, culprit_stack=WORKER_WAIT, child_cpu=100)
    assert worked is None or worked >= 11.0, worked
    # its main thread woke after its stack was taken: the stack no longer proves where it waits
    woke = _hang_opened_after(False, wake_after_stack_s=3.0)
    assert woke is not None and woke >= 11.0, woke


def test_ranks_waiting_in_different_collectives_are_said_to_have_diverged_without_a_culprit():
    # a rank that skipped a batch reaches the barrier while its peer is in the step's all_reduce:
    # the stacks cannot say which one diverged, so none is blamed and the summary says where each waits;
    # both at the same call is no divergence, and no rank missing from it: judged after hang_all_in_s
    ar = [("torch/distributed/distributed_c10d.py", "all_reduce"), ("train.py", "step")]
    bar = [("torch/distributed/distributed_c10d.py", "barrier"), ("train.py", "finish")]
    for frames1, diverged in ((bar, True), (ar, False)):
        node = Node([P(10, 1), *two_ranks()])
        node.run(5)
        node.stack(11, ar)
        node.stack(12, frames1)
        node.run(20 if diverged else Thresholds().hang_all_in_s + 5)
        (inc,) = node.an.incidents()
        assert ("different collectives" in inc.summary) is diverged, inc.summary
        if diverged:
            assert inc.culprit_ranks == [] and "barrier called from train.py" in inc.summary


def _diverged(stacks_by_pid: dict[int, list[tuple[str, str, int]]], world: int = 2):
    """The hang incident of ``world`` ranks (pids 11...) all waiting, each at the stack given."""
    ranks = [P(11 + r, 10, torchrun_env(r, world), gpu=r, log=f"/job/log{r}") for r in range(world)]
    node = Node([P(10, 1), *ranks])
    node.run(5)
    for pid, frames in stacks_by_pid.items():
        node.stack(pid, frames)
    node.run(20)
    (inc,) = node.an.incidents()
    return inc


AR = ("torch/distributed/distributed_c10d.py", "all_reduce", 2950)
BAR = ("torch/distributed/distributed_c10d.py", "barrier", 5356)
BWD = ("torch/autograd/graph.py", "_engine_run_backward", 979)


def test_of_two_ranks_in_different_collectives_the_one_further_along_is_the_likely_culprit():
    # uneven inputs: the rank with fewer batches leaves the loop and waits at the barrier after it
    # while its peer waits in the step's all_reduce. Which rank is ahead, how it got there (the
    # same caller or another one, the caller's next line) and the collectives vary
    loop = [("train.py", "train", 40), ("train.py", "main", 90), ("train.py", "<module>", 99)]
    after = [("train.py", "train", 52), ("train.py", "main", 90), ("train.py", "<module>", 99)]
    other_caller = [("train.py", "train", 52), ("launch.py", "run_rank", 7), ("launch.py", "<module>", 30)]
    returned = [("train.py", "main", 91), ("train.py", "<module>", 99)]  # train() returned; the next line
    for behind, ahead, culprit in (([BWD, *loop], [BAR, *after], 1), ([BAR, *after], [BWD, *loop], 0),
                                   ([AR, *loop], [BAR, *other_caller], 1), ([AR, *loop], [AR, *returned], 1)):
        inc = _diverged({11: behind, 12: ahead})
        assert inc.culprit_ranks == [culprit], inc.summary
        assert "likely culprit" in inc.summary and "diverged" in inc.summary and "skipped" in inc.summary, inc.summary
        assert "Join" in inc.next_step and "TORCH_DISTRIBUTED_DEBUG" in inc.next_step, inc.next_step


def test_of_more_ranks_at_two_collectives_the_fewer_are_the_odd_ones_out():
    # one of three made a collective the others do not, or skipped theirs: its line does not matter
    loop = [("train.py", "train", 40), ("train.py", "<module>", 99)]
    odd = [("train.py", "train", 30), ("train.py", "<module>", 99)]
    for odd_pid in (11, 12, 13):
        inc = _diverged({p: [BAR, *odd] if p == odd_pid else [AR, *loop] for p in (11, 12, 13)}, world=3)
        assert inc.culprit_ranks == [odd_pid - 11], inc.summary
        assert "odd one out" in inc.summary and "2 ranks wait in all_reduce" in inc.summary, inc.summary


def test_ranks_at_one_line_in_different_collectives_or_at_three_sites_blame_none():
    # the same statement calling two collectives, or three sites among three ranks: nothing says who
    same_line = [("train.py", "train", 40), ("train.py", "<module>", 99)]
    inc = _diverged({11: [AR, *same_line], 12: [BAR, *same_line]})
    assert inc.culprit_ranks == [] and "different collectives" in inc.summary, inc.summary
    bc = ("torch/distributed/distributed_c10d.py", "broadcast", 2700)
    inc = _diverged({11: [AR, *same_line], 12: [BAR, ("train.py", "train", 50)], 13: [bc, ("train.py", "train", 60)]}, world=3)
    assert inc.culprit_ranks == [] and "different collectives" in inc.summary, inc.summary


def test_a_lone_stopped_process_is_no_hang():
    # a world of one has no peer waiting for it: stopped (Ctrl-Z) it is hung itself, but no job hangs on it
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0, state="T", wchan="do_signal_stop")])
    node.run(30)
    assert node.kinds() == []


def _server_stack(pid: int, main: list[tuple[str, str, int]]):
    """Rank 0 of a server: its main thread's frames (innermost first), and a thread 'listener' in
    accept that fills the request queue the main thread polls."""
    from hangd.snapshot import Frame, StackSample, ThreadStack

    def th(tid, name, frames):
        return ThreadStack(tid=tid, name=name, active=False, owns_gil=False,
                           frames=[Frame(name=f, filename=fn, line=ln) for fn, f, ln in frames])
    return StackSample(pid=pid, threads=[
        th(pid, "MainThread", main),
        th(pid + 100, "listener", [("socket.py", "accept", 295), ("srv.py", "listener", 40), ("threading.py", "run", 1010)])])


OUTER = [("srv.py", "serve", 62), ("srv.py", "main", 90)]
POLL = [("threading.py", "wait", 359), ("queue.py", "get", 180)] + OUTER
STEP = [("srv.py", "broadcast_batch", 85), ("srv.py", "serve", 67), ("srv.py", "main", 90)]


def _polling_server(r0: P, r1: P) -> Node:
    """The launcher and the two ranks after 5 s; then a capture shows rank 0 polling its request
    queue and rank 1 in the broadcast (COLL), and 4 s more pass."""
    node = Node([P(10, 1), r0, r1])
    node.run(5)
    node.pending_stacks.append(_server_stack(11, POLL))
    node.stack(12, COLL)
    node.run(4)
    return node


@pytest.mark.parametrize("rank0_cpu, hang", [(20, False), (60, False), (100, True)],
                         ids=["polls_on_little_cpu", "polls_on_half_a_core", "spins_in_its_loop"])
def test_a_server_caught_between_its_polls_stays_an_idle_server(rank0_cpu: int, hang: bool):
    # an NCCL server: rank 0 polls a queue its listener thread fills and broadcasts the empty batch,
    # rank 1 spins in that broadcast. A capture of rank 0 in its broadcast step (no wait in it) is the
    # same loop: the server stays idle, whatever wait point its poll is caught at. Its broadcast's
    # spin may take half a core (eight ranks on one GPU: matrix-gpu mpargv-warmup-none-w8), and it
    # keeps waking: still its polls. A rank 0 that burns a core in that loop has left its polls: no
    # idle server, and its job hangs
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, vol_per_s=20, cpu_ticks_per_s=rank0_cpu)
    r1 = P(12, 10, torchrun_env(1, 2), gpu=0, look="spin", state="R", cpu_ticks_per_s=100)
    node = _polling_server(r0, r1)
    node.pending_stacks.append(_server_stack(11, STEP))
    for i in range(40 * 4):
        r0.state, r0.wchan = ("R", "0") if i % 3 == 0 else ("S", "futex_do_wait" if i % 2 else "hrtimer_nanosleep")
        node.tick()
    assert (node.kinds() != []) == hang, node.kinds()
    if not hang:
        assert node.state(11) == "idle" and node.state(12) == "idle"



HANDLER = [("srv.py", "wait_forever", 97), ("srv.py", "handle", 50), ("srv.py", "serve", 70), ("srv.py", "main", 90)]


@pytest.mark.parametrize("captures, hang", [([HANDLER, HANDLER, POLL, HANDLER], False), ([HANDLER] * 3, True)],
                         ids=["between_its_polls_twice_then_polling", "in_its_handler_three_times_in_a_row"])
def test_a_server_caught_again_and_again_at_one_place_outside_its_wait_is_there(captures, hang):
    # rank 0 polls; a request comes, and its handler sleeps in a loop of its own forever (on little
    # CPU, waking every 0.5 s) while rank 1 waits in the next broadcast. A capture or two in the
    # handler may be the loop between two polls (each asks for another capture at once); caught
    # there three times in a row it is where rank 0 stays: its job is hung, not an idle server.
    # Caught polling between (a capture in its wait for requests) it still serves
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, vol_per_s=2, cpu_ticks_per_s=5, wchan="hrtimer_nanosleep")
    r1 = P(12, 10, torchrun_env(1, 2), gpu=1, look="spin", state="R", cpu_ticks_per_s=100)
    node = _polling_server(r0, r1)
    for frames in captures:
        node.pending_stacks.append(_server_stack(11, frames))
        node.run(5)
    node.run(20)
    assert (node.kinds() != []) == hang, [(i.kind, i.summary) for i in node.an.incidents()]
    if hang:
        (inc,) = node.an.incidents()
        assert inc.culprit_ranks == [0], (inc.kind, inc.culprit_ranks, inc.summary)
    else:
        assert node.state(11) == "idle" and node.state(12) == "idle", (node.an.tracks[11].reason, node.an.tracks[12].reason)

def test_a_server_polling_on_a_gpu_its_waiting_rank_spins_on_is_idle_not_in_the_spin():
    # both ranks on one GPU: rank 1 spins in the broadcast of each empty batch (no stack that says
    # where: py-spy came back empty), rank 0 polls its request queue. NVML gives the GPU's spin to
    # both; rank 0's stack says it waits for requests: the spin is rank 1's, and the job is an idle
    # server, not two ranks in a collective (seen: a false nccl_stall on spawn-serve_poll-none)
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, look="spin", vol_per_s=17, cpu_ticks_per_s=20)
    r1 = P(12, 10, torchrun_env(1, 2), gpu=0, look="spin", state="R", wchan="0", cpu_ticks_per_s=200)
    node = Node([P(10, 1), r0, r1])
    node.run(5)
    node.pending_stacks.append(_server_stack(11, POLL))
    node.run(40)
    assert node.kinds() == [], [(i.kind, i.summary) for i in node.an.incidents()]
    assert node.state(11) == "idle" and node.state(12) == "idle", (node.an.tracks[11].reason, node.an.tracks[12].reason)
    assert "the spin on its GPU is rank 1's collective" in node.an.tracks[11].reason, node.an.tracks[11].reason


@pytest.mark.parametrize("rank0_stack, culprit", [(COLL, [1]), (EVENT, None)], ids=["rank0_in_a_collective", "no_collective_stack"])
def test_two_ranks_sharing_a_gpu_the_one_blocked_on_its_own_is_not_in_the_spin(rank0_stack, culprit):
    # two ranks on one GPU (each its own NCCL_HOSTID): the GPU spins, NVML tells no one's share.
    # Rank 0's stack is in a collective, rank 1's blocked on an event: the spin is rank 0's, rank 1 is
    # the culprit. With no stack in a collective the spin may be either's (a rank whose main thread
    # waits on a Condition while its own NCCL kernel spins): still a hang, nobody cleared of it
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, look="spin", state="R", cpu_ticks_per_s=100)
    r1 = P(12, 10, torchrun_env(1, 2), gpu=0, look="spin")
    node = Node([P(10, 1), r0, r1])
    node.run(5)
    node.stack(11, rank0_stack)
    node.stack(12, EVENT)
    node.run(15)
    (inc,) = node.an.incidents()
    assert inc.kind == "nccl_stall"
    if culprit is not None:
        assert inc.culprit_ranks == culprit
        assert "the spin on its GPU is rank 0's collective" in inc.summary


MiB = 1 << 20
IMPORTS = [("<frozen importlib._bootstrap>", "_find_and_load"), ("train.py", "<module>")]


@pytest.mark.parametrize("spinner", ["hidden", "rank"], ids=["a_process_hangd_cannot_see", "a_rank_with_its_communicator"])
def test_a_rank_holding_its_cuda_context_alone_is_not_the_one_spinning_its_gpu(spinner):
    # rank 1 is still setting up on the CPU with 518 MiB on its GPU (a CUDA context, no NCCL
    # communicator), while the GPU spins: for a process NVML does not list (another container's
    # job: memory on the GPU that no listed process holds), or for rank 0 on the same GPU in a
    # collective with its communicator in. The spin is not rank 1's: it does not wait for a peer
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0 if spinner == "rank" else 1, gpu_mem=1182 * MiB,
           look="spin" if spinner == "rank" else "idle", state="R", cpu_ticks_per_s=100)
    r1 = P(12, 10, torchrun_env(1, 2), gpu=0, gpu_mem=518 * MiB, state="R", cpu_ticks_per_s=100)
    node = Node([P(10, 1), r0, r1])
    if spinner == "hidden":
        node.hidden[0] = (2 * GiB, "spin")
    node.run(3)
    node.stack(12, IMPORTS)
    if spinner == "rank":
        node.stack(11, COLL)
    node.run(12)
    (p1,) = [p for p in node.an.processes() if p["pid"] == 12]
    assert "spinning" not in p1["reason"] and p1["state"] != "waiting_peer", p1
    assert "CUDA context alone" in p1["reason"], p1["reason"]
    assert ("a process hangd cannot see" in p1["reason"]) is (spinner == "hidden"), p1["reason"]
    # once 3 readings show the memory no listed process holds (the first tick has one)
    said = {c.state for c in node.changes if c.pid == 12 and c.t >= 1000.75}
    assert "waiting_peer" not in said, [(c.t, c.state, c.reason) for c in node.changes if c.pid == 12]


@pytest.mark.parametrize("shared", [False, True], ids=["alone_on_its_gpu", "gpu_shared"])
def test_a_rank_with_its_context_alone_spins_its_gpu_when_nobody_else_can(shared):
    # alone on its GPU (nothing unlisted on it) the spin can only be its own, whatever it holds;
    # a rank with more than a context (its communicator, 1182 MiB) on a GPU another process uses
    # may be the spinner: both keep the spin
    r1 = P(12, 10, torchrun_env(1, 2), gpu=0, gpu_mem=(1182 if shared else 518) * MiB, look="spin")
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=1, state="R", cpu_ticks_per_s=100), r1])
    if shared:
        node.hidden[0] = (2 * GiB, "spin")
    node.run(10)
    (p1,) = [p for p in node.an.processes() if p["pid"] == 12]
    assert "spinning in a GPU collective" in p1["reason"], p1["reason"]


@pytest.mark.parametrize("mem_mib", [518, 1182], ids=["context_alone", "with_its_communicator"])
def test_a_rank_nvml_gives_sm_time_keeps_the_spin_whatever_else_is_on_its_gpu(mem_mib):
    # NVML's per-process samples give rank 1 the SM time: the spin is its own, even on a GPU that a
    # process hangd cannot see holds memory on, with its context alone or its stack in a wait of its own
    r1 = P(12, 10, torchrun_env(1, 2), gpu=0, gpu_mem=mem_mib * MiB, look="spin")
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 2), gpu=1, state="R", cpu_ticks_per_s=100), r1])
    node.hidden[0] = (2 * GiB, "idle")
    node.sm[12] = 90
    node.run(3)
    node.stack(12, EVENT)
    node.run(8)
    (p1,) = [p for p in node.an.processes() if p["pid"] == 12]
    assert "spinning in a GPU collective" in p1["reason"] and "cannot see" not in p1["reason"], p1["reason"]


def test_a_rank_blocked_on_its_own_is_cleared_of_a_spin_a_hidden_process_may_make():
    # rank 1 holds its communicator and waits on an event; its GPU spins and holds 2 GiB that no
    # listed process holds: that spin may be the hidden process's, rank 1's stack says it waits
    # on its own, and rank 0 (on the other GPU, in a collective) waits for it
    r0 = P(11, 10, torchrun_env(0, 2), gpu=1, gpu_mem=1182 * MiB, look="spin")
    r1 = P(12, 10, torchrun_env(1, 2), gpu=0, gpu_mem=1182 * MiB)
    node = Node([P(10, 1), r0, r1])
    node.hidden[0] = (2 * GiB, "spin")
    node.run(3)
    node.stack(11, COLL)
    node.stack(12, EVENT)
    node.run(20)
    (inc,) = node.an.incidents()
    assert inc.kind == "nccl_stall" and inc.culprit_ranks == [1], (inc.kind, inc.culprit_ranks, inc.summary)
    assert "the spin on its GPU is that of a process hangd cannot see" in inc.summary, inc.summary


def test_each_rank_shows_the_evidence_record_it_was_judged_on():
    # rank 0 trains: its GPU works, it burns a core and writes its log; rank 1 waits in a collective
    # whose main thread keeps waking (its collectives complete), on a GPU with no per-process samples
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, look="work", state="R", cpu_ticks_per_s=100, log="/job/r0.log",
           wchar_per_s=2000)
    r1 = P(12, 10, torchrun_env(1, 2), gpu=1, vol_per_s=40)
    node = Node([P(10, 1), r0, r1])
    node.run(3)
    node.stack(12, COLL)
    for _ in range(6):
        node.write_log("/job/r0.log", "[rank0]: step\n")
        node.run(1)
    moved = {p["pid"]: p["moved"] for p in node.an.processes()}
    assert moved[11]["gpu_work"] == "yes: its GPU works", moved[11]
    assert moved[11]["cpu_own_code"] == "yes: on CPU (1.0 cores)", moved[11]
    assert moved[11]["log"] == "yes: wrote to its log", moved[11]
    assert moved[11]["children"] == "unknown" and moved[11]["collectives"] in ("no", "unknown"), moved[11]
    assert moved[12]["collectives"] == "yes: its collectives complete", moved[12]
    assert moved[12]["gpu_work"] == "no" and moved[12]["log"] == "no" and moved[12]["cpu_own_code"] == "no", moved[12]


def test_a_process_reported_by_an_older_hangd_has_an_empty_evidence_record():
    from hangd.front import ProcessRecord

    old = {"pid": 5, "rank": 0, "rank_from": "env", "job": "j", "state": "busy", "since": 1.0, "reason": "r",
           "gpus": [0], "gpu_mem_bytes": None, "cpu_cores": None, "last_progress": None, "last_progress_why": "",
           "command": None, "log_grew_at": None}
    rec = ProcessRecord.of(old)
    assert rec.moved == {} and rec.to_dict()["moved"] == {}
    assert ProcessRecord.of({**old, "moved": {"log": "no"}}).moved == {"log": "no"}


def test_a_checkpoint_writer_s_record_says_how_fast_it_writes():
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, state="D", wchar_per_s=100_000_000)
    node = Node([P(10, 1), r0, P(12, 10, torchrun_env(1, 2), gpu=1)])
    node.run(10)
    (p0,) = [p for p in node.an.processes() if p["pid"] == 11]
    assert p0["moved"]["write"] == "yes: wrote 100 MB/s (wchar)", p0["moved"]


def test_the_owner_s_info_labels_carry_slurm_and_the_pod():
    from hangd.analysis import owner

    who = {"user": "ana", "slurm": {"job_id": "77", "name": "llm", "account": "ml", "partition": "h200"},
           "pod": {"namespace": "train", "name": "p-0", "container": "main", "uid": "u-1"}}
    assert owner.labels(who, owner.INFO_LABELS) == ["ana", "77", "train", "p-0", "llm", "ml", "h200", "main", "u-1"]
    assert owner.labels(None) == ["", "", "", ""]


def test_a_stack_is_classified_by_the_catalog_it_is_given():
    from hangd.analysis import stackcat
    from hangd.snapshot import Frame, ThreadStack

    th = ThreadStack(tid=1, name="MainThread", active=False, owns_gil=False,
                     frames=[Frame(name="wait_here", filename="/opt/job/mine.py", line=3)])
    rules = stackcat.load_catalog('[[rule]]\nkind = "lock_wait"\npriority = 50\nwhy = "mine"\npatterns = ["mine\\\\.py:wait_here$"]\n')
    assert stackcat.classify_thread(th, rules).kind == "lock_wait"
    assert stackcat.classify_thread(th).kind == "unknown"
