"""What a rank's main thread is blocked on, read from /proc: the file descriptors of its system
call and who holds their other ends.

A rank asleep in ``poll``, ``select``, ``epoll_wait``, ``read``, ``recv`` or ``accept`` waits on file
descriptors. ``/proc/PID/syscall`` names the call and its arguments; the descriptors come from
them (the first argument, the ``pollfd`` array or ``fd_set`` in the process's memory, the epoll
set in ``/proc/PID/fdinfo``). Each one's other end is then found without touching the process:
a pipe's other holders are the watched processes holding the same pipe inode; a Unix socket's
peer is asked of the kernel (``sock_diag``, the netlink interface ``ss`` uses); a TCP
connection's other end is the local socket with the mirrored addresses in ``/proc/net/tcp``.
A listening socket is input from outside the job. A wait in ``wait4``/``waitid`` is a wait on a
child process.

Everything here only reads; a file that cannot be read (another user's process, a kernel without
the file) leaves the value unknown (``None``), never empty. The analysis decides what the other
end means for the job (hangd/analysis/otherend.py).
"""

from __future__ import annotations

import os
import platform
import queue
import socket
import struct
import threading
import time
from collections.abc import Iterable
from typing import Any

from hangd.snapshot import FdWait, ProcSample

# System call numbers: x86_64 and the generic table (aarch64), and how each names its descriptors.
SYSCALLS: dict[str, dict[int, str]] = {
    "x86_64": {219: "restart_syscall", 0: "read", 19: "readv", 7: "poll", 23: "select", 43: "accept", 45: "recvfrom", 47: "recvmsg",
               61: "wait4", 232: "epoll_wait", 247: "waitid", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait",
               288: "accept4", 299: "recvmmsg", 441: "epoll_pwait2", 202: "futex", 35: "nanosleep",
               230: "clock_nanosleep"},
    "aarch64": {128: "restart_syscall", 63: "read", 65: "readv", 73: "ppoll", 72: "pselect6", 202: "accept", 207: "recvfrom",
                212: "recvmsg", 260: "wait4", 22: "epoll_pwait", 95: "waitid", 242: "accept4", 243: "recvmmsg",
                441: "epoll_pwait2", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep"},
}
FIRST_ARG = frozenset({"read", "readv", "accept", "accept4", "recvfrom", "recvmsg", "recvmmsg"})
POLLS = frozenset({"poll", "ppoll"})
SELECTS = frozenset({"select", "pselect6"})
EPOLLS = frozenset({"epoll_wait", "epoll_pwait", "epoll_pwait2"})
WAITS = frozenset({"wait4", "waitid"})
SLEEPS = frozenset({"futex", "nanosleep", "clock_nanosleep"})  # a wait on no descriptor: certain
MAX_FDS = 256  # descriptors of one wait looked at; a wait on more is cut there
MAX_HELD = 4096  # descriptors of one process indexed for who holds the other end (past it: unknown)
LINK_BUDGET = 16384  # descriptor links read in one tick over all processes (past it: unknown)
MAX_EPOLL_FDS = 2048  # an epoll set read from fdinfo at most in a process of this many descriptors:
# the kernel lists the whole set under the epoll's lock, which the job's own epoll calls then wait on
MAX_DIAG = 64  # sock_diag questions a tick
DEADLINE_S = 0.1  # the most a tick waits for these reads (they take 0.03-2 ms when nothing blocks)
REFRESH_S = 5.0  # an unchanged wait is resolved again at most this often
READER_IDLE_S = 30.0  # the reader thread ends after this long with no read to do
TCP_LISTEN, TCP_ESTABLISHED = "0A", "01"
UNIX_LISTEN = 10  # the socket state sock_diag reports for a listening Unix socket


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, ValueError):
        return None


def parse_syscall(text: str, table: dict[int, str]) -> tuple[str, list[int]] | None:
    """``/proc/PID/syscall``: the call's name and its six arguments; None when it runs or is not
    in a system call (``running``, ``-1 sp pc``)."""
    parts = text.split()
    if len(parts) < 7 or not parts[0].isdigit():
        return None
    try:
        args = [int(a, 16) for a in parts[1:7]]
    except ValueError:
        return None
    return table.get(int(parts[0]), f"syscall {parts[0]}"), args


def parse_epoll_fdinfo(text: str) -> list[int]:
    """The descriptors an epoll instance watches: its ``tfd:`` lines in /proc/PID/fdinfo."""
    fds = []
    for line in text.splitlines():
        if line.startswith("tfd:"):
            f = line.split()
            if len(f) > 1 and f[1].isdigit():
                fds.append(int(f[1]))
    return fds[:MAX_FDS]


def parse_pollfds(raw: bytes) -> list[int]:
    """A ``struct pollfd`` array: its descriptors asked for input (a negative one is ignored)."""
    out = []
    for i in range(min(len(raw) // 8, MAX_FDS)):
        fd, events, _ = struct.unpack_from("=ihh", raw, 8 * i)
        if fd >= 0 and events & 0x1:  # POLLIN
            out.append(fd)
    return out


def parse_fdset(raw: bytes, nfds: int) -> list[int]:
    """An ``fd_set`` bitmap of ``nfds`` bits: the descriptors it holds."""
    out = []
    for fd in range(min(nfds, len(raw) * 8)):
        if raw[fd // 8] >> (fd % 8) & 1:
            out.append(fd)
            if len(out) >= MAX_FDS:
                break
    return out


def _ip(hexaddr: str) -> str:
    host, port = hexaddr.split(":")
    b = bytes.fromhex(host)
    if len(b) == 4:
        ip = socket.inet_ntop(socket.AF_INET, b[::-1])
    else:  # /proc/net/tcp6: four 32-bit words, each in host order
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(b[i:i + 4][::-1] for i in range(0, 16, 4)))
        ip = ip.removeprefix("::ffff:")
    return f"{ip}:{int(port, 16)}"


def parse_net_tcp(text: str) -> dict[int, tuple[str, str, str]]:
    """/proc/net/tcp(6): inode -> (local address, remote address, state in hex). A connection not
    yet accepted has inode 0: such rows get keys below zero, which no descriptor names."""
    out = {}
    for n, line in enumerate(text.splitlines()[1:]):
        f = line.split()
        if len(f) < 10 or not f[9].isdigit():
            continue
        try:
            out[int(f[9]) or -1 - n] = (_ip(f[1]), _ip(f[2]), f[3])
        except (ValueError, IndexError):
            continue
    return out


def unix_peer(ino: int) -> tuple[int | None, int | None]:
    """(peer inode, state) of a Unix socket, from the kernel's socket diagnostics; (None, None)
    where the kernel does not say."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4) as s:  # NETLINK_SOCK_DIAG
            s.settimeout(0.2)
            # unix_diag_req: family, protocol, pad, states (all), inode, show (UDIAG_SHOW_PEER), no cookie
            req = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, ino, 4, 0xFFFFFFFF, 0xFFFFFFFF)
            s.sendto(struct.pack("=IHHII", 16 + len(req), 20, 0x1, 1, 0) + req, (0, 0))  # SOCK_DIAG_BY_FAMILY
            data = s.recv(8192)
    except OSError:
        return None, None
    if len(data) < 32:
        return None, None
    length, typ = struct.unpack_from("=IH", data, 0)
    if typ != 20:  # an error message (no such socket): unknown
        return None, None
    state = data[18]
    a = 32
    while a + 4 <= min(length, len(data)):
        rl, rt = struct.unpack_from("=HH", data, a)
        if rl < 4:
            break
        if rt == 2 and a + 8 <= len(data):  # UNIX_DIAG_PEER
            return struct.unpack_from("=I", data, a + 4)[0], state
        a += (rl + 3) & ~3
    return None, state


class FdWaits:
    """Reads, for each watched rank asleep in a wait on descriptors, what it waits on.

    Bounded per tick: each process's descriptor table is read at most every REFRESH_S and up to
    MAX_HELD entries, all of them together up to LINK_BUDGET links; what the bounds leave unread is
    unknown, never "nobody". A rank in uninterruptible sleep is not read at all (its memory may be
    locked by the very thread that hangs)."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.root = proc_root
        self.table = SYSCALLS.get(platform.machine(), {})  # another architecture: every call unknown
        self._cache: dict[int, tuple[str, float, str | None, list[FdWait] | None]] = {}
        self._watched: list[int] = []
        # pid -> (when read, {link target: [fd, ...]}, cut short); kept REFRESH_S
        self._tables: dict[int, tuple[float, dict[str, list[int]], bool]] = {}
        self._budget = LINK_BUDGET
        self._tick_at = 0.0  # when this tick's reads began: tables read before it may be stale
        self._tcp: dict[str, tuple[dict[int, tuple[str, str, str]], dict[tuple[str, str], int]]] = {}
        self._diag: dict[int, tuple[int | None, int | None]] = {}
        self._busy = threading.Event()  # a read is under way (it may have outlasted its tick)
        self._done = threading.Event()  # the read handed to the reader thread is done
        self._jobs: queue.SimpleQueue[tuple[list[ProcSample], list[int], dict[int, Any]]] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None  # one thread for every tick's reads, not one a tick
        self._lock = threading.Lock()  # starting and ending the reader thread
        self.overruns = 0  # ticks whose reads outlasted DEADLINE_S

    def _p(self, pid: int, *parts: str) -> str:
        return os.path.join(self.root, str(pid), *parts)

    def collect(self, samples: Iterable[ProcSample], watched: Iterable[int]) -> None:
        """Fill ``wait_syscall`` and ``fd_waits`` of the samples that are ranks asleep.

        The reads run on a thread of their own and the tick waits for them at most DEADLINE_S: a
        read of /proc can block in the kernel (a process's memory lock held by one of its threads,
        an exec in progress), and a watcher that stops sampling while a job hangs sees nothing.
        Past the deadline this tick's values stay unknown, and no new read starts until that one
        came back."""
        if self._busy.is_set():
            return
        todo = [s for s in samples
                if not s.gone and s.role == "worker" and s.state == "S" and not (s.thread_states or {}).get("D")]
        watched = sorted(watched)
        out: dict[int, tuple[str | None, list[FdWait] | None]] = {}
        self._busy.set()
        self._done.clear()
        with self._lock:
            if self._reader is None or not self._reader.is_alive():
                self._reader = threading.Thread(target=self._serve, name="hangd-fdwait", daemon=True)
                self._reader.start()
            self._jobs.put((todo, watched, out))
        if not self._done.wait(DEADLINE_S):
            self.overruns += 1
            return  # it clears _busy when it returns; what it found is not this tick's
        for s in todo:
            if s.pid in out:
                s.wait_syscall, s.fd_waits = out[s.pid]

    def _serve(self) -> None:
        """The reader thread: each tick's reads in turn; it ends after READER_IDLE_S with none (a
        source no longer ticked leaves no thread behind), and the next tick starts another."""
        while True:
            try:
                todo, watched, out = self._jobs.get(timeout=READER_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._reader = None
                        return
                continue
            try:
                self._collect(todo, watched, out)
            finally:
                self._done.set()  # before _busy clears: a tick that then starts a read waits for its own
                self._busy.clear()

    def _collect(self, todo: list[ProcSample], watched: list[int], out: dict[int, tuple[str | None, list[FdWait] | None]]) -> None:
        self._tcp, self._diag, self._budget = {}, {}, LINK_BUDGET
        self._watched = watched
        now = self._tick_at = time.monotonic()
        for pid in [p for p, (at, _, _) in self._tables.items() if now - at >= REFRESH_S or p not in watched]:
            del self._tables[pid]
        for s in todo:
            text = _read(self._p(s.pid, "syscall"))
            if text is None:
                continue
            hit = self._cache.get(s.pid)
            if hit is not None and hit[0] == text and now - hit[1] < REFRESH_S:
                out[s.pid] = hit[2], hit[3]
                continue
            try:
                out[s.pid] = self.read(s.pid, text)
            except Exception:  # noqa: BLE001 - a process that changed mid-read: unknown, this tick only
                out[s.pid] = None, None
            self._cache[s.pid] = (text, now, *out[s.pid])
        for pid in set(self._cache) - {s.pid for s in todo}:
            del self._cache[pid]

    def read(self, pid: int, text: str) -> tuple[str | None, list[FdWait] | None]:
        """The call named by ``text`` (its /proc/PID/syscall) and what each of its descriptors is."""
        call = parse_syscall(text, self.table)
        if call is None:
            return None, None
        name, args = call
        if name in WAITS:
            target = args[0] if name == "wait4" else args[1]
            child = target if 0 < target < 1 << 31 and (name == "wait4" or args[0] == 1) else None  # P_PID
            return name, [FdWait(fd=-1, kind="child", holders=[child] if child else [])]
        fds = self._fds_of(pid, name, args)
        if fds is None:
            return name, None
        waits = [self._resolve(pid, fd) for fd in fds]
        for w in waits:
            others = set(w.holders) - {pid}
            if others:
                w.holders_listen = sorted(self._listening(pid, others))
        return name, waits

    def _fds_of(self, pid: int, name: str, args: list[int]) -> list[int] | None:
        if name in SLEEPS:
            return []  # a futex, a sleep: no descriptor
        if name in FIRST_ARG:
            return [args[0]] if args[0] < 1 << 31 else None
        if name in EPOLLS:
            table, cut = self._table(pid)
            if cut or sum(len(v) for v in table.values()) > MAX_EPOLL_FDS:
                return None
            info = _read(self._p(pid, "fdinfo", str(args[0])))
            return parse_epoll_fdinfo(info) if info is not None else None
        if name in POLLS:
            raw = self._mem(pid, args[0], 8 * min(args[1], MAX_FDS))
            return parse_pollfds(raw) if raw is not None else None
        if name in SELECTS:
            n = min(args[0], 1024)
            raw = self._mem(pid, args[1], (n + 7) // 8) if args[1] else b""
            return parse_fdset(raw, n) if raw is not None else None
        return None  # restart_syscall (after a stop), a write, a call of another table: unknown

    def _mem(self, pid: int, addr: int, size: int) -> bytes | None:
        """Bytes of the process's memory, read through /proc (the process is not stopped)."""
        if size <= 0:
            return b""
        try:
            with open(self._p(pid, "mem"), "rb", buffering=0) as f:
                f.seek(addr)
                return f.read(size)
        except (OSError, ValueError, OverflowError):
            return None

    def _table(self, pid: int) -> tuple[dict[str, list[int]], bool]:
        """Its pipes and sockets: link target -> its descriptors, and whether the read was cut short
        (MAX_HELD, the tick's LINK_BUDGET, or the process went away)."""
        hit = self._tables.get(pid)
        if hit is not None:
            return hit[1], hit[2]
        out: dict[str, list[int]] = {}
        cut = False
        try:
            with os.scandir(self._p(pid, "fd")) as it:
                for n, e in enumerate(it):
                    if n >= MAX_HELD or self._budget <= 0:
                        cut = True
                        break
                    self._budget -= 1
                    try:
                        t = os.readlink(e.path)
                    except OSError:
                        continue
                    if t.startswith(("pipe:", "socket:")) and e.name.isdigit():
                        out.setdefault(t, []).append(int(e.name))
        except OSError:
            cut = True
        self._tables[pid] = (time.monotonic(), out, cut)
        return out, cut

    def _holders(self, target: str) -> tuple[list[int], bool]:
        """The watched processes holding ``target`` ("pipe:[123]"), the waiting one included (a pipe
        whose ends only it holds is fed by a thread of its own, or by nobody), and whether that is
        all of them (False: some table was cut short)."""
        held, whole = [], True
        for p in self._watched:
            table, cut = self._table(p)
            whole = whole and not cut
            if target in table:
                held.append(p)
        return held, whole

    def _resolve(self, pid: int, fd: int) -> FdWait:
        try:
            target = os.readlink(self._p(pid, "fd", str(fd)))
        except OSError:
            return FdWait(fd=fd, kind="unknown")
        if target.startswith("pipe:"):
            holders, whole = self._holders(target)
            own = self._tables.get(pid)
            if pid not in holders and own is not None and not own[2] and own[0] < self._tick_at:
                # its own table, kept from an earlier tick (REFRESH_S), lacks the pipe it waits on:
                # the pipe is newer than the tables kept, and so may be any other holder's entry;
                # those of earlier ticks are read again (once a tick: the link budget bounds it)
                for p in [p for p, (at, _, _) in self._tables.items() if at < self._tick_at]:
                    del self._tables[p]
                holders, whole = self._holders(target)
            if not whole and not set(holders) - {pid}:
                return FdWait(fd=fd, kind="unknown")  # its other end may be in a table not read
            return FdWait(fd=fd, kind="pipe", holders=holders, writes_itself=self._writes(pid, fd, target))
        if target.startswith("socket:[") and target[8:-1].isdigit():
            return self._socket(pid, fd, int(target[8:-1]))
        if target.startswith("anon_inode:"):
            return FdWait(fd=fd, kind=target[11:].strip("[]") or "anon")
        return FdWait(fd=fd, kind="file" if target.startswith("/") else "other")

    def _writes(self, pid: int, fd: int, target: str) -> bool:
        """It holds the write end of the pipe ``target`` as well (a descriptor opened O_WRONLY)."""
        for n in self._table(pid)[0].get(target, []):
            if n == fd:
                continue
            info = _read(self._p(pid, "fdinfo", str(n))) or ""
            flags = next((ln.split()[1] for ln in info.splitlines() if ln.startswith("flags:")), None)
            if flags is not None and flags.isdigit() and int(flags, 8) & 3 == 1:  # O_WRONLY
                return True
        return False

    def _net(self, pid: int) -> str:
        """The network namespace ``pid`` is in: /proc/net of hangd's own may not be the job's."""
        try:
            return os.readlink(self._p(pid, "ns", "net"))
        except OSError:
            return f"pid {pid}"

    def _tcp_of(self, pid: int) -> tuple[dict[int, tuple[str, str, str]], dict[tuple[str, str], int]]:
        """Its namespace's TCP sockets by inode, and by (local, remote) to find a connection's mirror."""
        ns = self._net(pid)
        if ns not in self._tcp:
            rows: dict[int, tuple[str, str, str]] = {}
            for name, below in (("tcp", 0), ("tcp6", 1 << 24)):  # keep the two files' unaccepted rows apart
                rows.update({k if k > 0 else k - below: v
                             for k, v in parse_net_tcp(_read(self._p(pid, "net", name)) or "").items()})
            self._tcp[ns] = (rows, {(r[0], r[1]): i for i, r in rows.items()})
        return self._tcp[ns]

    def _unix(self, ino: int) -> tuple[int | None, int | None]:
        if ino not in self._diag:
            if len(self._diag) >= MAX_DIAG:
                return None, None
            self._diag[ino] = unix_peer(ino)
        return self._diag[ino]

    def _socket(self, pid: int, fd: int, ino: int) -> FdWait:
        tcp, by_ends = self._tcp_of(pid)
        row = tcp.get(ino)
        if row is not None:
            local, remote, state = row
            if state == TCP_LISTEN:
                return FdWait(fd=fd, kind="tcp", listening=True, local=local)
            other = by_ends.get((remote, local))
            holders, whole = self._holders(f"socket:[{other}]") if other is not None else ([], True)
            if other is not None and not whole and not holders:
                return FdWait(fd=fd, kind="unknown")
            return FdWait(fd=fd, kind="tcp", local=local, remote=remote, holders=holders,
                          remote_here=other is not None)
        peer, ustate = self._unix(ino)
        if ustate is None:
            return FdWait(fd=fd, kind="socket")
        if ustate == UNIX_LISTEN:
            return FdWait(fd=fd, kind="unix", listening=True)
        holders, whole = self._holders(f"socket:[{peer}]") if peer else ([], True)
        if peer and not whole and not holders:
            return FdWait(fd=fd, kind="unknown")
        return FdWait(fd=fd, kind="unix", holders=holders, remote_here=bool(peer))

    def _listening(self, pid: int, pids: set[int]) -> set[int]:
        """Which of ``pids`` hold a listening socket (TCP or Unix): a front end taking requests.
        The kernel is asked about each of their sockets (Unix ones by ``sock_diag``, within the
        tick's MAX_DIAG); the TCP table is read once a tick. A socket the waiting rank holds as well
        is one they share by inheritance (a fork), not a front end's own."""
        mine = set(self._table(pid)[0])
        out: set[int] = set()
        tcp_candidates: dict[int, int] = {}
        for p in sorted(pids):
            for t in self._table(p)[0]:
                if not t.startswith("socket:[") or not t[8:-1].isdigit() or t in mine:
                    continue
                ino = int(t[8:-1])
                _, state = self._unix(ino)
                if state is None:
                    tcp_candidates[ino] = p
                elif state == UNIX_LISTEN:
                    out.add(p)
        if tcp_candidates:
            tcp, _ = self._tcp_of(pid)
            out |= {p for ino, p in tcp_candidates.items() if (row := tcp.get(ino)) is not None and row[2] == TCP_LISTEN}
        return out
