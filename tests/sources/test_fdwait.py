"""What a rank's main thread waits on, read from /proc against real processes: the descriptors of
its system call and who holds their other ends (hangd/sources/fdwait.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from hangd.snapshot import Snapshot
from hangd.sources.fdwait import (
    parse_epoll_fdinfo,
    parse_fdset,
    parse_net_tcp,
    parse_pollfds,
    parse_syscall,
)
from hangd.sources.procfs import ProcSource
from tests.teardown import kill_all

RANK_ENV = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29998", "RANK": "0", "WORLD_SIZE": "1"}

# Each rank prints its helper pids (a child, a server) on its first line, then blocks for good.
PRELUDE = "import os, sys, socket, select, selectors, subprocess, time, threading, multiprocessing as mp\n"
CASES = {
    # the DataLoader's shape: a multiprocessing queue read (poll on a pipe) fed by a worker process;
    # the rank listens (gloo does) before it forks, so the worker inherits that socket
    "queue_from_worker": """
def work(q):
    time.sleep(600)
if __name__ == "__main__":
    gloo = socket.create_server(("127.0.0.1", 0))
    q = mp.get_context("fork").Queue()
    w = mp.get_context("fork").Process(target=work, args=(q,))
    w.start()
    print(w.pid, flush=True)
    while True:
        try:
            q.get(timeout=30)
        except Exception:
            pass
""",
    # select on a pipe whose write end only a child it started holds (subprocess with pass_fds)
    "select_pipe_from_child": """
r, w = os.pipe()
c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], pass_fds=(w,))
os.close(w)
print(c.pid, flush=True)
while True:
    select.select([r], [], [], 30)
""",
    # a pipe both of whose ends it holds itself: a thread of its own would write it (or nobody will)
    "pipe_of_its_own": """
r, w = os.pipe()
print("", flush=True)
while True:
    select.select([r], [], [], 30)
""",
    # a pipe of its own waited on for 2 s, then a new one of its own waited on for good: the
    # descriptor tables read during the first wait predate the second pipe
    "new_pipe_of_its_own": """
r, w = os.pipe()
print("", flush=True)
select.select([r], [], [], 2)
r2, w2 = os.pipe()
while True:
    select.select([r2], [], [], 30)
""",
    # a server: epoll (the default selector) on a listening TCP socket
    "tcp_accept": """
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print("", flush=True)
sel = selectors.DefaultSelector(); sel.register(s, selectors.EVENT_READ)
while True:
    sel.select(30)
""",
    # accept() itself, on a listening Unix socket
    "unix_accept": """
s = socket.socket(socket.AF_UNIX); s.bind("\\0hangd-test-%d" % os.getpid()); s.listen()
print("", flush=True)
s.accept()
""",
    # recv on a socketpair whose other end a worker process holds (a duplex multiprocessing Pipe)
    "recv_from_worker": """
def work(c):
    time.sleep(600)
if __name__ == "__main__":
    a, b = mp.get_context("fork").Pipe()
    w = mp.get_context("fork").Process(target=work, args=(b,))
    w.start()
    b.close()
    print(w.pid, flush=True)
    a.recv()
""",
    # recv on a TCP connection to a server process on this host that is not part of the job
    "tcp_to_outsider": """
c = socket.create_connection(("127.0.0.1", int(os.environ["OUTSIDE_PORT"])))
print("", flush=True)
c.recv(1)
""",
    # waiting for a child process to exit (subprocess.wait: wait4)
    "wait_child": """
c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(c.pid, flush=True)
c.wait()
""",
    # a futex: no descriptor at all
    "event": """
print("", flush=True)
threading.Event().wait()
""",
}


def _start(case: str, **env: str) -> tuple[subprocess.Popen, int | None]:
    p = subprocess.Popen([sys.executable, "-c", PRELUDE + CASES[case]], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, **RANK_ENV, **env), start_new_session=True)
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    return p, int(line) if line else None


# libc chooses among equivalent calls (select is pselect6 in glibc, recv may be recvfrom)
FAMILY = {"poll": ("poll", "ppoll"), "select": ("select", "pselect6"), "read": ("read", "recvfrom", "recvmsg"),
          "recvfrom": ("recvfrom", "recvmsg", "read"), "wait4": ("wait4", "waitid"),
          "epoll_wait": ("epoll_wait", "epoll_pwait", "epoll_pwait2"), "accept4": ("accept", "accept4"),
          "futex": ("futex",)}


def _waits(src: ProcSource, pid: int, want: str, until: float = 15.0):
    """The rank's sample once its main thread sleeps in ``want`` or a call of its family (imports
    and set-up take a moment)."""
    end = time.time() + until
    while True:
        snap = Snapshot(t=time.time())
        src.collect(snap)
        s = next((p for p in snap.procs if p.pid == pid), None)
        if s is not None and s.wait_syscall in FAMILY[want] and s.fd_waits is not None or time.time() > end:
            return s
        time.sleep(0.2)


@pytest.mark.parametrize(("case", "call", "kind", "fed_by"), [
    ("queue_from_worker", "poll", "pipe", "helper"),
    ("select_pipe_from_child", "select", "pipe", "helper"),
    ("pipe_of_its_own", "select", "pipe", "itself"),
    ("recv_from_worker", "read", "unix", "helper"),
    ("tcp_to_outsider", "recvfrom", "tcp", "nobody"),
    ("wait_child", "wait4", "child", "helper"),
])
def test_the_other_end_of_a_wait_is_found(case, call, kind, fed_by):
    """Each way a rank blocks on the job's own processes (or on one outside it) names who holds
    the other end: a worker process, a child, itself, or no process of the job."""
    outsider = socket.create_server(("127.0.0.1", 0))  # a server of this host that is not the job's
    p, helper = _start(case, OUTSIDE_PORT=str(outsider.getsockname()[1]))
    try:
        s = _waits(ProcSource(extra_pids={p.pid}), p.pid, call)
        assert s is not None and s.wait_syscall in FAMILY[call], f"{case}: {s and s.wait_syscall}"
        assert s.fd_waits, f"{case}: no descriptor read"
        w = next(w for w in s.fd_waits if w.kind == kind)
        assert not w.listening
        others = set(w.holders) - {p.pid}
        if fed_by == "helper":
            assert helper in others, f"{case}: {w}"
            assert not w.holders_listen, f"{case}: a socket inherited from the rank is no front end's: {w}"
        elif fed_by == "itself":
            assert w.holders == [p.pid] and not others
        else:  # a process on this host that is not watched: the other end is here, held by nobody of the job
            assert w.remote_here and not others and w.remote and w.remote.startswith("127.0.0.1:")
    finally:
        kill_all([p.pid], p)
        outsider.close()


@pytest.mark.parametrize(("case", "call", "kind"), [("tcp_accept", "epoll_wait", "tcp"),
                                                     ("unix_accept", "accept4", "unix")])
def test_a_listening_socket_is_input_from_outside(case, call, kind):
    p, _ = _start(case)
    try:
        s = _waits(ProcSource(extra_pids={p.pid}), p.pid, call)
        assert s is not None and s.wait_syscall in FAMILY[call], s and s.wait_syscall
        assert s.fd_waits and any(w.kind == kind and w.listening for w in s.fd_waits), s.fd_waits
    finally:
        kill_all([p.pid], p)


def test_a_futex_wait_has_no_descriptor():
    p, _ = _start("event")
    try:
        s = _waits(ProcSource(extra_pids={p.pid}), p.pid, "futex")
        assert s is not None and s.wait_syscall == "futex" and s.fd_waits == []
    finally:
        kill_all([p.pid], p)


def test_a_process_that_is_no_rank_is_not_read():
    """Only ranks are read: children and launchers are described by the ranks that wait on them."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                         env={k: v for k, v in os.environ.items() if k not in ("RANK", "MASTER_ADDR")})
    try:
        time.sleep(0.5)
        src = ProcSource(job_env=("NO_SUCH_KEY",), extra_pids={p.pid})
        snap = Snapshot(t=time.time())
        src.collect(snap)
        s = next(x for x in snap.procs if x.pid == p.pid)
        assert s.role != "worker" and s.wait_syscall is None and s.fd_waits is None
    finally:
        kill_all([p.pid], p)


def test_parsers_refuse_what_they_cannot_read():
    table = {7: "poll"}
    assert parse_syscall("running", table) is None
    assert parse_syscall("-1 0x7ffd 0x7f00", table) is None
    assert parse_syscall("7 0x7f327c66c150 0x1 0xffffffff 0x1 0x0 0x0 0x7ffea4cf7a38 0x7f327c91a230", table) == \
        ("poll", [0x7F327C66C150, 1, 0xFFFFFFFF, 1, 0, 0])
    assert parse_syscall("7 0xzz 0x1 0x2 0x3 0x4 0x5 0 0", table) is None
    assert parse_syscall("999 0x0 0x0 0x0 0x0 0x0 0x0 0 0", table)[0] == "syscall 999"
    assert parse_pollfds(b"\x05\x00\x00\x00\x01\x00\x00\x00" + b"\xff\xff\xff\xff\x01\x00\x00\x00" + b"\x01") == [5]
    assert parse_fdset(bytes([0b00100100]), 8) == [2, 5]
    assert parse_fdset(bytes([0xFF]), 3) == [0, 1, 2]
    assert parse_epoll_fdinfo("pos:\t0\nflags:\t02\ntfd:        5 events:       19 data: 5\ntfd: x\n") == [5]
    tcp = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
           "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1\n"
           "   1: garbage\n")
    assert parse_net_tcp(tcp) == {4242: ("127.0.0.1:30000", "0.0.0.0:0", "0A")}


def test_a_real_socket_s_peer_comes_from_the_kernel():
    from hangd.sources.fdwait import unix_peer

    a, b = socket.socketpair()
    try:
        peer, _ = unix_peer(os.fstat(a.fileno()).st_ino)
        assert peer == os.fstat(b.fileno()).st_ino
        assert unix_peer(1) == (None, None)  # no such socket: unknown
    finally:
        a.close()
        b.close()


def test_calls_it_cannot_place_are_unknown_not_no_descriptor():
    """A poll resumed after a stop (restart_syscall), a write, a call of another architecture's
    table: what it waits on is unknown (None), never "nothing" ([]); only a futex or a sleep is."""
    from hangd.sources.fdwait import FdWaits

    fw = FdWaits()
    fw.table = {219: "restart_syscall", 1: "write", 202: "futex", 230: "clock_nanosleep"}
    args = " 0x0 0x0 0x0 0x0 0x0 0x0 0x7ffd 0x7f00"
    assert fw.read(os.getpid(), "219" + args) == ("restart_syscall", None)
    assert fw.read(os.getpid(), "1" + args) == ("write", None)
    assert fw.read(os.getpid(), "7" + args) == ("syscall 7", None)  # not in this table
    assert fw.read(os.getpid(), "202" + args) == ("futex", [])
    assert fw.read(os.getpid(), "230" + args) == ("clock_nanosleep", [])


def test_a_pipe_newer_than_the_tables_kept_is_read_whole():
    """The tables a read keeps (REFRESH_S) were read before the rank made the pipe it now waits on:
    its holders are read again, not taken as nobody (which would read as input from outside)."""
    p, _ = _start("new_pipe_of_its_own")
    try:
        src = ProcSource(extra_pids={p.pid})
        first = _waits(src, p.pid, "select")
        assert first is not None and first.fd_waits, first
        t_end = time.time() + 10
        while True:  # the second wait, on a descriptor the first did not have
            s = _waits(src, p.pid, "select")
            if s is not None and s.fd_waits and {w.fd for w in s.fd_waits} != {w.fd for w in first.fd_waits}:
                break
            assert time.time() < t_end, (first.fd_waits, s and s.fd_waits)
            time.sleep(0.2)
        (w,) = s.fd_waits
        assert w.kind == "pipe" and w.holders == [p.pid] and w.writes_itself, w
    finally:
        kill_all([p.pid], p)


def test_a_descriptor_table_cut_short_leaves_the_other_end_unknown(monkeypatch):
    """Past MAX_HELD descriptors of a process the rest is not read: a pipe whose other holder may be
    among them is unknown, never "held by nobody of the job" (which would read as a server)."""
    from hangd.sources import fdwait

    monkeypatch.setattr(fdwait, "MAX_HELD", 2)
    p, helper = _start("queue_from_worker")
    try:
        s = _waits(ProcSource(extra_pids={p.pid}), p.pid, "poll")
        assert s is not None and s.fd_waits, s
        assert all(w.kind == "unknown" or helper in w.holders for w in s.fd_waits), s.fd_waits
        assert not any(w.kind == "pipe" and w.holders == [p.pid] for w in s.fd_waits), s.fd_waits
    finally:
        kill_all([p.pid], p)


def test_a_read_that_blocks_in_the_kernel_does_not_stall_the_tick(monkeypatch):
    """A read of /proc can block (a memory lock held by a thread of the rank, an exec under way):
    the tick waits DEADLINE_S at most, leaves this tick's values unknown, and starts no second read
    while the first is out; once it returns, the next tick reads again."""
    import threading

    from hangd.sources import fdwait

    release = threading.Event()
    real = fdwait._read

    def stuck(path: str) -> str | None:
        if path.endswith("/syscall"):
            release.wait(10)
        return real(path)

    p, _ = _start("event")
    try:
        src = ProcSource(extra_pids={p.pid})
        assert _waits(src, p.pid, "futex").fd_waits == []
        monkeypatch.setattr(fdwait, "_read", stuck)
        src._fd_waits._cache.clear()  # type: ignore[union-attr]
        t0 = time.monotonic()
        for _ in range(3):
            snap = Snapshot(t=time.time())
            src.collect(snap)
            s = next(x for x in snap.procs if x.pid == p.pid)
            assert s.wait_syscall is None and s.fd_waits is None  # unknown, not "no descriptor"
        assert time.monotonic() - t0 < 2.0, "a blocked read held the ticks"
        assert src._fd_waits.overruns == 1  # type: ignore[union-attr]
        release.set()
        monkeypatch.setattr(fdwait, "_read", real)
        time.sleep(0.2)
        assert _waits(src, p.pid, "futex").fd_waits == []
    finally:
        release.set()
        kill_all([p.pid], p)
