"""Whose is the other end of what a rank waits on: the descriptors its main thread sleeps on
(``ProcSample.fd_waits``, read by hangd/sources/fdwait.py) against the processes of the node.

A wait whose other end is a process or thread of the job (a DataLoader worker, a pool, a child it
started, a pipe only it holds) is internal: when nothing moves, that is a hang. A wait on the
store its launcher serves is a wait for its peers. A wait on a
listening socket, or on a connection or pipe whose other end no process of the job holds, is for
input from outside: an idle server. A pure function of the view, so that a replayed trace and a
live node say the same; traces recorded before the descriptors were read give ``None`` (unknown:
the stack decides).
"""

from __future__ import annotations

from dataclasses import dataclass

from hangd.analysis.nodeview import NodeView
from hangd.snapshot import FdWait, Role

OWN_WORKER, OWN_THREAD, PEER, OUTSIDE = "own_worker", "own_thread", "peer", "outside"


@dataclass(frozen=True, slots=True)
class OtherEnd:
    kind: str  # OWN_WORKER, OWN_THREAD, PEER or OUTSIDE
    what: str  # in words: "a pipe held by its child pid 4242"
    pids: tuple[int, ...] = ()  # the processes at the other end, where known
    call: str = ""  # the system call it sleeps in
    channel: str = ""  # ``what`` without the pids ("a pipe held by its child"), where it names them
    store: bool = False  # a PEER wait on the store its job's launcher serves (start-up's rendezvous too)

    @property
    def brief(self) -> str:
        return self.channel or self.what


def _live(view: NodeView, pid: int) -> bool:
    h = view.procs.get(pid)
    if h is None or h.gone_at is not None:
        return False
    lp = h.latest()
    return lp is not None and lp.state != "Z"


def _descendants(view: NodeView, pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for c, h in view.procs.items():
        lp = h.latest()
        if h.gone_at is None and lp is not None and lp.ppid is not None:
            kids.setdefault(lp.ppid, []).append(c)
    out: set[int] = set()
    todo = list(kids.get(pid, []))
    while todo and len(out) < 4096:
        c = todo.pop()
        if c not in out:
            out.add(c)
            todo += kids.get(c, [])
    return out


def _ancestors(view: NodeView, pid: int) -> list[int]:
    out, cur = [], pid
    for _ in range(16):
        h = view.procs.get(cur)
        lp = h.latest() if h is not None else None
        if lp is None or lp.ppid is None or lp.ppid <= 1 or lp.ppid in out:
            break  # the top of the tree (init, a pid it did not see) or a loop of reused pids
        cur = lp.ppid
        out.append(cur)
    return out


def _pids(pids: list[int]) -> str:
    return ", ".join(str(p) for p in pids[:3]) + (f" and {len(pids) - 3} more" if len(pids) > 3 else "")


def _sock(w: FdWait) -> str:
    return {"pipe": "a pipe", "unix": "a Unix socket", "tcp": "a TCP connection"}.get(w.kind, f"a {w.kind}")


def other_end(view: NodeView, pid: int) -> OtherEnd | None:
    """What the descriptors its main thread sleeps on say of the other end; None when they were
    not read, when it waits on none (a futex, a sleep) or when they say nothing certain."""
    h = view.procs.get(pid)
    if h is None:
        return None
    lp = h.latest()
    if lp is None or not lp.fd_waits or lp.state != "S":  # the source reads only ranks asleep in S
        return None
    waits, call = lp.fd_waits, lp.wait_syscall or ""
    # input from outside wins: a server sleeps on its listening socket and its own pipes at once
    for w in waits:
        if w.listening:
            return OtherEnd(OUTSIDE, f"a listening {'TCP' if w.kind == 'tcp' else 'Unix'} socket"
                                     f"{' on ' + w.local if w.local else ''}", (), call)
    desc = _descendants(view, pid)
    anc = _ancestors(view, pid)
    ranks = {p for p, ph in view.procs.items() if p != pid and (x := ph.latest()) is not None and x.role == Role.WORKER}
    siblings = {p for p, ph in view.procs.items() if p != pid and anc and (x := ph.latest()) is not None
                and x.ppid == anc[0] and x.role != Role.WORKER}
    for w in waits:
        end = _end_in_job(view, pid, w, call, desc, anc, ranks, siblings)
        if end is not None:
            return end
    return _end_outside(pid, waits, call)


def _end_in_job(view: NodeView, pid: int, w: FdWait, call: str, desc: set[int], anc: list[int],
                ranks: set[int], siblings: set[int]) -> OtherEnd | None:
    """The process of its job at the other end of one descriptor: its child, a worker of its own,
    a peer rank, a front end, the store its launcher serves; None when no process of its job is."""
    others = [p for p in w.holders if p != pid and _live(view, p)]
    if w.kind == "child":
        kids = others or sorted(c for c in desc if view.procs[c].latest() and view.procs[c].latest().ppid == pid)  # type: ignore[union-attr]
        if kids:
            return OtherEnd(OWN_WORKER, f"the exit of its child pid {_pids(kids)}", tuple(kids), call,
                            "the exit of its child")
        return None
    mine = [p for p in others if p in desc]
    if mine:  # its own children first: a forked worker inherits its listening sockets too
        chan = f"{_sock(w)} held by its {'child' if len(mine) == 1 else 'children'}"
        return OtherEnd(OWN_WORKER, f"{chan} pid {_pids(mine)}", tuple(mine), call, chan)
    peers = [p for p in others if p in ranks]
    if peers:  # before any listener: every gloo or NCCL rank listens for its peers
        return OtherEnd(PEER, f"{_sock(w)} to the rank pid {_pids(peers)}", tuple(peers), call)
    # a process of no rank that listens for connections and feeds it through a pipe or a Unix
    # socket: a front end passing requests on (a TCP connection to a listener is that
    # listener's own service, such as the rendezvous store of its launcher)
    fronts = [p for p in w.holders_listen if p in others and p not in desc] if w.kind != "tcp" else []
    if fronts:
        return OtherEnd(OUTSIDE, f"{_sock(w)} from pid {_pids(fronts)}, which listens for connections",
                        tuple(fronts), call)
    # a TCP connection to a service that its launcher (or another process of its job) listens
    # for: torchrun's agent serves the rendezvous store every rank meets in
    stores = [p for p in w.holders_listen if p in others and (p in anc or p in siblings)] if w.kind == "tcp" else []
    if stores:
        who = "its launcher" if stores[0] in anc else "a process of its job"
        return OtherEnd(PEER, f"a TCP connection to the store {who} pid {_pids(stores)} serves for its ranks",
                        tuple(stores), call, store=True)
    job = [p for p in others if p in anc or p in siblings]
    if job:
        chan = f"{_sock(w)} held by {'its launcher' if job[0] in anc else 'a process of its job'}"
        return OtherEnd(OWN_WORKER, f"{chan} pid {_pids(job)}", tuple(job), call, chan)
    return None


def _end_outside(pid: int, waits: list[FdWait], call: str) -> OtherEnd | None:
    """No process of its job at any other end: a pipe only it holds, or input from elsewhere."""
    ends = [w for w in waits if w.kind in ("pipe", "unix", "tcp")]
    if not ends or len(ends) < len(waits):
        return None  # an eventfd, a file, a descriptor that could not be read: not certain
    if any(w.kind == "pipe" and pid not in w.holders for w in ends):
        return None  # a pipe read without the rank itself among its holders: read before it was known
    if all(w.holders == [pid] and (w.kind != "pipe" or w.writes_itself) for w in ends):
        if call.startswith("epoll") or any(w.kind == "tcp" for w in ends):
            # an event loop on its own wake-up pipe alone may sleep on a timer; a TCP connection to
            # itself is a service a thread of it runs for others (rank 0's rendezvous store)
            return None  # an event loop on its own wake-up pipe alone: it may as well sleep on a timer
        return OtherEnd(OWN_THREAD, f"{_sock(ends[0])} only it holds: a thread of its own writes it, or nobody",
                        (pid,), call)
    if any(w.kind == "tcp" and not w.remote_here for w in ends):
        return None  # a connection to another host (or namespace): a peer there, or a client: unknown
    if all(not [p for p in w.holders if p != pid] for w in ends):
        w = ends[0]
        where = f" to {w.remote}" if w.remote else ""
        return OtherEnd(OUTSIDE, f"{_sock(w)}{where} whose other end no process of its job holds", (), call)
    return None
