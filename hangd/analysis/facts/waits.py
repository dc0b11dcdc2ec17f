"""Wait facts: what it waits on, by its process state, its descriptors' other ends and its kernel
wait point."""

from __future__ import annotations

from hangd.analysis import otherend
from hangd.analysis.facts import RankIn
from hangd.analysis.signals import ProcSignals
from hangd.analysis.thresholds import Thresholds

# Kernel wait points of a process waiting for work from outside (a socket, an event loop).
REQUEST_WCHANS = ("inet_csk_accept", "ep_poll", "do_epoll_wait", "do_select", "do_sys_poll", "unix_stream_read",
                  "sk_wait_data", "pipe_read", "do_poll")


def zombie(r: RankIn) -> bool:
    """It exited and is not yet reaped (state Z)."""
    return r.s.state == "Z"


def stopped(r: RankIn) -> bool:
    """It is stopped (state T: SIGSTOP or a debugger): it runs no code at all."""
    return r.s.state == "T"


def asleep(r: RankIn) -> bool:
    """Its main thread sleeps (state S or D)."""
    return r.s.state in ("S", "D")


def descriptors_decide(r: RankIn) -> bool:
    """Whose is the other end of what its main thread sleeps on is known, and it uses little CPU:
    what the descriptors say beats a frame's name (a rank whose other threads compute is judged on them)."""
    return r.ctx.other_end is not None and r.s.cpu_cores is not None and r.s.cpu_cores < r.th.busy_cpu_cores


def other_end_outside(r: RankIn) -> bool:
    """The other end is outside its job: a listening socket, a client, a front end."""
    return r.ctx.other_end is not None and r.ctx.other_end.kind == otherend.OUTSIDE


def other_end_own(r: RankIn) -> bool:
    """The other end is its own: a worker process of its job, or a thread of its own."""
    return r.ctx.other_end is not None and r.ctx.other_end.kind in (otherend.OWN_WORKER, otherend.OWN_THREAD)


def other_end_peer(r: RankIn) -> bool:
    """The other end is another rank, or the store its peers meet in."""
    return r.ctx.other_end is not None and r.ctx.other_end.kind == otherend.PEER


def wchan_request(r: RankIn) -> bool:
    """It sleeps at a kernel wait point of a process waiting for input (accept, epoll, select, a pipe read)."""
    return (r.s.wchan or "") in REQUEST_WCHANS


def wakes_in_calls(r: RankIn) -> bool:
    """Its main thread wakes ``wake_per_s`` times a second or more: a thread streaming while the
    main thread hangs would not wake it."""
    return (r.s.wakes_per_s or 0) >= r.th.wake_per_s

def same_wait_point(wchan: str | None, s: ProcSignals, th: Thresholds) -> bool:
    """It still waits where its stack was taken: the same kernel wait point, or caught running for
    a moment between two sleeps there (a loop that wakes to poll, on a fraction of a core)."""
    if wchan is None or s.wchan is None or s.state == "t" or wchan == s.wchan:
        return True
    return s.state == "R" and s.wchan == "0" and (s.cpu_cores or 0) < th.busy_cpu_cores and \
        s.r_fraction < th.runnable_fraction
