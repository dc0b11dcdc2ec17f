"""Whose is the other end of a wait (hangd/analysis/otherend.py), and what a rank's state becomes
with it: a wait on the job's own worker, thread or launcher is internal (a hang when nothing
moves), one on the store its launcher serves is a wait for its peers, a wait on a listening socket or on input no process of the job sends is idle."""

from __future__ import annotations

import pytest

from hangd.analysis import otherend, stackcat
from hangd.analysis.facts import Context
from hangd.analysis.model import Local
from hangd.analysis.nodeview import NodeView
from hangd.analysis.rankstate import classify
from hangd.snapshot import FdWait, ProcSample, Role, Snapshot

from .builders import Node, P, torchrun_env
from .test_local import IDLE, TH, sig

RANK, CHILD, LAUNCHER, PEER, FRONT = 11, 21, 10, 12, 30


def view(waits: list[FdWait] | None, call: str = "poll", state: str = "S") -> NodeView:
    """A launcher with two ranks, one of which (RANK) has a child; RANK sleeps in ``call`` on ``waits``."""
    v = NodeView()
    snap = Snapshot(t=100.0, procs=[
        ProcSample(pid=LAUNCHER, ppid=1, state="S", role=Role.LAUNCHER),
        ProcSample(pid=RANK, ppid=LAUNCHER, state=state, role=Role.WORKER, wait_syscall=call, fd_waits=waits),
        ProcSample(pid=PEER, ppid=LAUNCHER, state="S", role=Role.WORKER),
        ProcSample(pid=CHILD, ppid=RANK, state="S", role=Role.CHILD),
        ProcSample(pid=FRONT, ppid=1, state="S", role=Role.CHILD),
    ])
    v.feed(snap)
    return v


CASES = [
    # (name, descriptors, kind, a phrase of what it says)
    ("a DataLoader queue: a pipe its worker holds", [FdWait(fd=5, kind="pipe", holders=[RANK, CHILD])],
     otherend.OWN_WORKER, f"held by its child pid {CHILD}"),
    ("a DataLoader worker that inherited the rank's listening socket (gloo's)",
     [FdWait(fd=5, kind="pipe", holders=[RANK, CHILD], holders_listen=[CHILD])],
     otherend.OWN_WORKER, f"held by its child pid {CHILD}"),
    ("a socketpair to its pool process", [FdWait(fd=7, kind="unix", holders=[CHILD], remote_here=True)],
     otherend.OWN_WORKER, f"a Unix socket held by its child pid {CHILD}"),
    ("subprocess.wait on its child", [FdWait(fd=-1, kind="child", holders=[CHILD])],
     otherend.OWN_WORKER, f"the exit of its child pid {CHILD}"),
    ("waitpid(-1): any child", [FdWait(fd=-1, kind="child")], otherend.OWN_WORKER, f"pid {CHILD}"),
    ("a pipe only it holds, both ends", [FdWait(fd=3, kind="pipe", holders=[RANK], writes_itself=True)],
     otherend.OWN_THREAD, "a thread of its own"),
    ("a socketpair of its own", [FdWait(fd=3, kind="unix", holders=[RANK], remote_here=True)],
     otherend.OWN_THREAD, "only it holds"),
    ("a pipe its launcher writes", [FdWait(fd=4, kind="pipe", holders=[RANK, LAUNCHER])],
     otherend.OWN_WORKER, f"its launcher pid {LAUNCHER}"),
    ("a TCP connection to the other rank", [FdWait(fd=9, kind="tcp", holders=[PEER], remote_here=True,
                                                   local="127.0.0.1:4000", remote="127.0.0.1:4001")],
     otherend.PEER, f"to the rank pid {PEER}"),
    ("a listening socket", [FdWait(fd=6, kind="tcp", listening=True, local="0.0.0.0:8000")],
     otherend.OUTSIDE, "a listening TCP socket on 0.0.0.0:8000"),
    ("a server's epoll set: its own wake-up pipe and a listening socket",
     [FdWait(fd=3, kind="pipe", holders=[RANK], writes_itself=True), FdWait(fd=6, kind="unix", listening=True)],
     otherend.OUTSIDE, "listening Unix socket"),
    ("requests from a front end that listens", [FdWait(fd=8, kind="unix", holders=[FRONT], holders_listen=[FRONT],
                                                      remote_here=True)],
     otherend.OUTSIDE, f"from pid {FRONT}, which listens"),
    ("a connection to a server of this host outside the job",
     [FdWait(fd=8, kind="tcp", local="127.0.0.1:5000", remote="127.0.0.1:6000", remote_here=True)],
     otherend.OUTSIDE, "to 127.0.0.1:6000 whose other end no process of its job holds"),
    ("the rendezvous store on the other rank, which listens (gloo's and the store's sockets)",
     [FdWait(fd=8, kind="tcp", holders=[PEER], holders_listen=[PEER], remote_here=True,
             local="127.0.0.1:5000", remote="127.0.0.1:29500")],
     otherend.PEER, f"to the rank pid {PEER}"),
    ("the store of its launcher (torchrun's agent listens on it)",
     [FdWait(fd=8, kind="tcp", holders=[LAUNCHER], holders_listen=[LAUNCHER], remote_here=True,
             local="127.0.0.1:5000", remote="127.0.0.1:29400")],
     otherend.PEER, f"the store its launcher pid {LAUNCHER} serves"),
    ("a TCP connection its launcher holds without listening (it dialled the rank)",
     [FdWait(fd=8, kind="tcp", holders=[LAUNCHER], remote_here=True, local="127.0.0.1:5000", remote="127.0.0.1:41000")],
     otherend.OWN_WORKER, f"held by its launcher pid {LAUNCHER}"),
    ("a pipe another program writes (stdin from a shell)", [FdWait(fd=0, kind="pipe", holders=[RANK])],
     otherend.OUTSIDE, "no process of its job holds"),
]


WHAT = {  # the whole sentence each case says, as summaries quote it
    "a DataLoader queue: a pipe its worker holds": "a pipe held by its child pid 21",
    "a socketpair to its pool process": "a Unix socket held by its child pid 21",
    "subprocess.wait on its child": "the exit of its child pid 21",
    "a pipe only it holds, both ends": "a pipe only it holds: a thread of its own writes it, or nobody",
    "a socketpair of its own": "a Unix socket only it holds: a thread of its own writes it, or nobody",
    "a pipe its launcher writes": "a pipe held by its launcher pid 10",
    "a TCP connection to the other rank": "a TCP connection to the rank pid 12",
    "a listening socket": "a listening TCP socket on 0.0.0.0:8000",
    "a server's epoll set: its own wake-up pipe and a listening socket": "a listening Unix socket",
    "requests from a front end that listens": "a Unix socket from pid 30, which listens for connections",
    "a connection to a server of this host outside the job":
        "a TCP connection to 127.0.0.1:6000 whose other end no process of its job holds",
    "the store of its launcher (torchrun's agent listens on it)":
        "a TCP connection to the store its launcher pid 10 serves for its ranks",
    "a TCP connection its launcher holds without listening (it dialled the rank)":
        "a TCP connection held by its launcher pid 10",
    "a pipe another program writes (stdin from a shell)": "a pipe whose other end no process of its job holds",
}


@pytest.mark.parametrize(("name", "waits", "kind", "says"), CASES, ids=[c[0] for c in CASES])
def test_the_other_end(name, waits, kind, says):
    oe = otherend.other_end(view(waits), RANK)
    assert oe is not None and oe.kind == kind, f"{name}: {oe}"
    assert says in oe.what, f"{name}: {oe.what}"
    if name in WHAT:
        assert oe.what == WHAT[name], f"{name}: {oe.what}"
    assert oe.call == "poll"
    # the pids at the other end, where it names them (none for a listener or an unknown sender)
    assert set(oe.pids) == ({int(x) for x in oe.what.split("pid ")[1].split(",")[0].split()[:1]}
                            if "pid " in oe.what else ({RANK} if kind == otherend.OWN_THREAD else set())), oe
    assert oe.brief in oe.what and (kind != otherend.OWN_WORKER or "pid" not in oe.brief), oe


def extra_view(extra: list[ProcSample], waits: list[FdWait]) -> NodeView:
    v = view(waits)
    v.feed(Snapshot(t=100.25, procs=[*extra, *(ProcSample(pid=p, ppid=pp, state="S", role=r) for p, pp, r in (
        (LAUNCHER, 1, Role.LAUNCHER), (PEER, LAUNCHER, Role.WORKER), (CHILD, RANK, Role.CHILD),
        (FRONT, 1, Role.CHILD)))],
        ))
    v.feed(Snapshot(t=100.5, procs=[ProcSample(pid=RANK, ppid=LAUNCHER, state="S", role=Role.WORKER,
                                               wait_syscall="poll", fd_waits=waits)]))
    return v


@pytest.mark.parametrize(("name", "extra", "holders", "kind", "what"), [
    ("a pool of five workers: three named, the rest counted",
     [ProcSample(pid=p, ppid=RANK, state="S", role=Role.CHILD) for p in (41, 42, 43, 44)],
     [RANK, CHILD, 41, 42, 43, 44], otherend.OWN_WORKER, "a pipe held by its children pid 21, 41, 42 and 2 more"),
    ("a grandchild (a worker's own subprocess)", [ProcSample(pid=51, ppid=CHILD, state="S", role=Role.CHILD)],
     [RANK, 51], otherend.OWN_WORKER, "a pipe held by its child pid 51"),
    ("a sibling of no rank (a detokenizer beside the scheduler)",
     [ProcSample(pid=61, ppid=LAUNCHER, state="S", role=Role.CHILD)],
     [RANK, 61], otherend.OWN_WORKER, "a pipe held by a process of its job pid 61"),
    ("its only worker is a zombie (a stale holder list): not its worker, and nothing certain",
     [ProcSample(pid=71, ppid=RANK, state="Z", role=Role.CHILD)], [RANK, 71], None, None),
    ("its only worker is gone", [ProcSample(pid=72, gone=True)], [RANK, 72], None, None),
    ("a holder the view never saw (another namespace)", [], [RANK, 73], None, None),
])
def test_the_other_end_among_more_processes(name, extra, holders, kind, what):
    oe = otherend.other_end(extra_view(extra, [FdWait(fd=5, kind="pipe", holders=holders)]), RANK)
    assert (oe.kind, oe.what) == (kind, what) if oe is not None else kind is None, f"{name}: {oe}"


@pytest.mark.parametrize(("n", "said"), [(2, "pid 21, 41"), (3, "pid 21, 41, 42"), (4, "pid 21, 41, 42 and 1 more")])
def test_three_pids_are_named_then_counted(n, said):
    kids = [ProcSample(pid=p, ppid=RANK, state="S", role=Role.CHILD) for p in (41, 42, 43)]
    oe = otherend.other_end(extra_view(kids, [FdWait(fd=5, kind="pipe", holders=[RANK, CHILD, 41, 42, 43][:n + 1])]),
                            RANK)
    assert oe is not None and oe.what.endswith(said) and oe.what[-len(said) - 1] == " ", oe


def test_a_wait_for_any_child_names_its_children_not_their_children():
    grandchild = ProcSample(pid=51, ppid=CHILD, state="S", role=Role.CHILD)
    oe = otherend.other_end(extra_view([grandchild], [FdWait(fd=-1, kind="child")]), RANK)
    assert oe is not None and oe.pids == (CHILD,) and oe.what == f"the exit of its child pid {CHILD}"


def test_a_wait_for_a_child_that_is_gone_names_the_children_left():
    v = extra_view([ProcSample(pid=74, ppid=RANK, state="S", role=Role.CHILD)], [FdWait(fd=-1, kind="child", holders=[74])])
    v.feed(Snapshot(t=100.75, procs=[ProcSample(pid=74, gone=True)]))
    oe = otherend.other_end(v, RANK)
    assert oe is not None and oe.pids == (CHILD,), oe


def test_an_unnamed_call_and_an_uncertain_descriptor_beside_its_own_pipe():
    v = view([FdWait(fd=3, kind="pipe", holders=[RANK], writes_itself=True)], call=None)  # type: ignore[arg-type]
    oe = otherend.other_end(v, RANK)
    assert oe is not None and oe.call == "" and oe.kind == otherend.OWN_THREAD
    # its own pipe and an eventfd (zmq's mailbox, asyncio's): the eventfd may bring anything
    mixed = [FdWait(fd=3, kind="pipe", holders=[RANK], writes_itself=True), FdWait(fd=4, kind="eventfd")]
    assert otherend.other_end(view(mixed), RANK) is None


def test_a_pipe_read_without_the_rank_among_its_holders_says_nothing_certain():
    """The rank holds the pipe it waits on: a read that names nobody, not even it, was made before
    the tables knew that pipe (seen: a culprit's select on a pipe it had just made read as input from
    outside, its job as an idle server), not a pipe another program writes."""
    assert otherend.other_end(view([FdWait(fd=68, kind="pipe", holders=[])]), RANK) is None
    got = otherend.other_end(view([FdWait(fd=68, kind="pipe", holders=[RANK])]), RANK)
    assert got is not None and got.kind == otherend.OUTSIDE  # its read end alone: another program writes it


def test_a_watched_process_of_another_job_at_the_other_end_says_nothing_certain():
    """Not its child, not a rank, not its launcher or a sibling, and it does not listen: unknown."""
    stranger = ProcSample(pid=81, ppid=1, state="S", role=Role.CHILD)
    assert otherend.other_end(extra_view([stranger], [FdWait(fd=5, kind="pipe", holders=[RANK, 81])]), RANK) is None


def test_a_parent_chain_that_loops_ends():
    """A pid reused into its own ancestry (a trace's hostile or wrapped ppids) ends the walk."""
    v = NodeView()
    v.feed(Snapshot(t=100.0, procs=[
        ProcSample(pid=RANK, ppid=90, state="S", role=Role.WORKER, wait_syscall="poll",
                   fd_waits=[FdWait(fd=5, kind="pipe", holders=[RANK, 90])]),
        ProcSample(pid=90, ppid=91, state="S", role=Role.LAUNCHER),
        ProcSample(pid=91, ppid=90, state="S", role=Role.LAUNCHER)]))
    oe = otherend.other_end(v, RANK)
    assert oe is not None and oe.what == "a pipe held by its launcher pid 90"


def test_a_listening_socket_without_an_address_and_no_process_view():
    oe = otherend.other_end(view([FdWait(fd=6, kind="tcp", listening=True)]), RANK)
    assert oe is not None and oe.what == "a listening TCP socket" and oe.pids == ()
    assert otherend.other_end(NodeView(), RANK) is None  # a pid the view never saw


@pytest.mark.parametrize(("name", "waits", "state"), [
    ("a trace recorded before descriptors were read", None, "S"),
    ("a futex: no descriptor", [], "S"),
    ("an eventfd (zmq, asyncio): nobody known at the other end", [FdWait(fd=5, kind="eventfd")], "S"),
    ("a descriptor it could not read", [FdWait(fd=5, kind="unknown")], "S"),
    ("running: the wait is over", [FdWait(fd=5, kind="pipe", holders=[RANK, CHILD])], "R"),
    ("a TCP connection to itself: the rendezvous store its own thread serves to the other ranks",
     [FdWait(fd=8, kind="tcp", holders=[RANK], remote_here=True, local="127.0.0.1:5000", remote="127.0.0.1:29500")],
     "S"),
    ("a connection to another host: a peer there or a client", [FdWait(fd=8, kind="tcp", local="10.0.0.1:5000",
                                                                        remote="10.0.0.2:29500")], "S"),
])
def test_unknown_other_ends_leave_the_stack_to_decide(name, waits, state):
    assert otherend.other_end(view(waits, state=state), RANK) is None, name


def test_an_event_loop_on_its_own_wake_up_pipe_alone_is_not_judged():
    """asyncio with only timers sleeps in epoll_wait on its self-pipe: a sleep as much as a wait."""
    waits = [FdWait(fd=3, kind="unix", holders=[RANK], remote_here=True)]
    assert otherend.other_end(view(waits, call="epoll_wait"), RANK) is None
    assert otherend.other_end(view(waits, call="poll"), RANK).kind == otherend.OWN_THREAD  # type: ignore[union-attr]


SELECT = stackcat.Verdict("request_wait", "waiting for requests", "selectors.py:select:415", "MainThread", 60)
OWN = otherend.OtherEnd(otherend.OWN_WORKER, f"a pipe held by its child pid {CHILD}", (CHILD,), "poll")
OUT = otherend.OtherEnd(otherend.OUTSIDE, "a listening TCP socket on 0.0.0.0:8000", (), "epoll_wait")


@pytest.mark.parametrize(("name", "s", "verdict", "oe", "want"), [
    ("select() on its worker's pipe: the stack alone says requests", sig(gpu=IDLE, wchan="do_sys_poll", cpu_cores=0.0),
     SELECT, OWN,
     Local.WORKER_WAIT),
    ("no stack, asleep in poll on its worker's pipe", sig(gpu=IDLE, wchan="do_sys_poll", cpu_cores=0.0), None, OWN,
     Local.WORKER_WAIT),
    ("no stack, asleep in epoll on a listening socket", sig(wchan="ep_poll", cpu_cores=0.0), None, OUT, Local.SERVING),
    ("its CPU not read yet (a first reading): the descriptors do not decide", sig(gpu=IDLE, wchan="do_sys_poll"), None,
     OWN, None),
    ("the same poll without descriptors read: the wchan says requests", sig(gpu=IDLE, wchan="do_sys_poll"), None,
     None, Local.SERVING),
    ("busy on other threads while the main thread polls: the descriptors do not decide",
     sig(gpu=IDLE, wchan="do_sys_poll", cpu_cores=1.5), None, OWN, None),
])
def test_classify_reads_the_other_end_before_a_frame_s_name(name, s, verdict, oe, want):
    got = classify(s, Context(verdict=verdict or stackcat.UNKNOWN, other_end=oe), TH)
    decided = want is not None and oe is not None
    if want is None:
        want = classify(s, Context(verdict=verdict or stackcat.UNKNOWN), TH).local
    assert got.local == want, f"{name}: {got}"
    if decided:
        assert oe.brief in got.why and oe.call in got.why, got.why


def _reason(node: Node, pid: int) -> str:
    return next(p["reason"] for p in node.an.processes() if p["pid"] == pid)


def _select_job(waits: list[FdWait]) -> Node:
    """A 2-rank job with no GPU: rank 1 sleeps in select() on ``waits``, its stack only its own frame
    above select (what py-spy shows of a C call); rank 0 waits for it in a collective."""
    return Node([P(10, 1), P(11, 10, torchrun_env(0, 2), dist_threads=["gloo"], role="worker"),
                 P(12, 10, torchrun_env(1, 2), wchan="do_select", dist_threads=["gloo"], role="worker",
                   wait_syscall="pselect6", fd_waits=waits),
                 P(22, 12, role="child")])


def test_a_rank_selecting_on_its_child_s_pipe_is_a_hang_naming_the_child():
    node = _select_job([FdWait(fd=5, kind="pipe", holders=[12, 22])])
    node.run(2)
    node.stack(11, [("torch/distributed/distributed_c10d.py", "all_reduce"), ("train.py", "step")])
    node.stack(12, [("train.py", "read_batch"), ("train.py", "step")])
    node.run(40)
    assert node.state(12) == "hung", _reason(node, 12)
    hangs = [i for i in node.an.incidents() if i.kind == "host_stall"]
    assert len(hangs) == 1 and hangs[0].culprit_ranks == [1], [(i.kind, i.culprit_ranks) for i in node.an.incidents()]
    assert "pid 22" in hangs[0].summary, hangs[0].summary
    assert not [i for i in node.an.incidents() if i.kind == "straggler"]


def test_the_same_rank_selecting_on_a_listening_socket_is_an_idle_server():
    node = _select_job([FdWait(fd=5, kind="tcp", listening=True, local="0.0.0.0:8000")])
    node.run(2)
    node.stack(11, [("torch/distributed/distributed_c10d.py", "broadcast"), ("server.py", "loop")])
    node.stack(12, [("server.py", "accept_loop"), ("server.py", "main")])
    node.run(40)
    assert node.state(12) == "idle", _reason(node, 12)
    assert "listening TCP socket on 0.0.0.0:8000" in _reason(node, 12)
    assert not [i for i in node.an.incidents() if i.kind in ("host_stall", "nccl_stall", "straggler")], \
        [i.kind for i in node.an.incidents()]


STORE = [FdWait(fd=5, kind="tcp", holders=[10], holders_listen=[10], remote_here=True,
                local="127.0.0.1:41000", remote="127.0.0.1:29500")]


def test_a_rank_on_its_launcher_s_store_waits_for_its_peers_and_at_start_up_is_still_starting():
    """torchrun's agent serves the rendezvous store: a rank sleeping on it waits for its peers (a
    new group's handshake, a barrier on the store), and while it sets up that wait is its
    start-up's rendezvous, not the first sign of what it is for."""
    def on_the_store(node: Node) -> Node:
        r = node.procs[12]
        r.state, r.wchan, r.cpu_ticks_per_s = "R", "0", 90  # importing torch
        node.run(1)
        r.state, r.wchan, r.cpu_ticks_per_s = "S", "futex_do_wait", 0  # then the store's client thread
        node.run(2)
        r.state, r.wchan, r.cpu_ticks_per_s, r.wait_syscall, r.fd_waits = "S", "do_sys_poll", 0, "poll", STORE
        return node

    young = _select_job([])
    young.procs[12].dist_threads = None  # in init_process_group: no gloo threads yet
    on_the_store(young).run(3)
    assert young.state(12) == "starting", _reason(young, 12)
    node = _select_job([])
    node.stack(12, [("train.py", "step")])  # set up: a stack in its own code
    on_the_store(node).run(4)
    assert "the store its launcher pid 10 serves" in _reason(node, 12)
    assert node.state(12) in ("waiting_peer", "busy"), _reason(node, 12)


@pytest.mark.parametrize(("iterator", "inner", "kind"), [
    ("_SingleProcessDataLoaderIter", [], "computing"),
    ("_SingleProcessDataLoaderIter", [("selectors.py", "EpollSelector.select"), ("asyncio/base_events.py", "_run_once")],
     "computing"),
    ("_MultiProcessingDataLoaderIter", [], "worker_wait"), ("", [], "worker_wait")],
    ids=["no_workers_it_fetches_itself", "no_workers_its_dataset_reads_the_network", "workers", "py_spy_without_the_class"])
def test_a_dataloader_without_workers_is_the_rank_s_own_work(iterator, inner, kind):
    """As mpargv-load_slow-none's rank 0 was caught: a DataLoader with num_workers=0 runs the
    dataset's __getitem__ in the rank itself; there is no worker to wait for, and a select its
    dataset sleeps in (an HTTP or S3 read) is its own work, not a wait for requests."""
    from hangd.analysis import stackcat
    from hangd.snapshot import Frame, ThreadStack

    frames = [*inner, ("/opt/job/train.py", "Data.__getitem__"), ("torch/utils/data/_utils/fetch.py", "_MapDatasetFetcher.fetch"),
              ("torch/utils/data/dataloader.py", f"{iterator}._next_data" if iterator else "_next_data"),
              ("torch/utils/data/dataloader.py", "_BaseDataLoaderIter.__next__"), ("/opt/job/train.py", "train")]
    th = ThreadStack(tid=1, name="MainThread", active=False, owns_gil=False,
                     frames=[Frame(name=n, filename=f if f.startswith("/") else f"/opt/venv/lib/python3.12/site-packages/{f}",
                                   line=1) for f, n in frames])
    assert stackcat.classify_thread(th).kind == kind
