"""/proc: the processes of GPU jobs, read without touching them.

The watched set is every process holding a GPU (from the NVML readings already in the snapshot),
their ancestors up to the launcher, their descendants, and processes whose environment looks like
a distributed job (``MASTER_ADDR``/``RANK``/``TORCHELASTIC_RUN_ID``; configurable), which is how
hangd finds jobs on a host without GPUs. A process that vanishes mid-read, a zombie or a denied
read is normal: the value is absent, not an error.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from hangd.redact import DEFAULT_ENV_KEEP, filter_environ, redact_cmdline
from hangd.snapshot import ProcInfo, ProcSample, Role, Snapshot
from hangd.sources.base import Unavailable
from hangd.sources.fdwait import FdWaits
from hangd.sources.kube import PodResolver, parse_kube_cgroup, status_uid, user_name
from hangd.sources.procparse import (
    CLK_TCK,
    PAGE_SIZE,
    _parse_io,
    _read,
    _read_bytes,
    _stat_fields,
    _status_field,
    describe_cgroup,
    parse_environ,
    parse_stat,
)

# Where the walk up from a GPU process stops: these are sessions and service managers, not launchers.
STOP_COMMS = frozenset({
    "systemd", "init", "sshd", "bash", "sh", "zsh", "fish", "dash", "tmux: server", "tmux",
    "screen", "SCREEN", "containerd-shim", "containerd-shim-runc-v2", "sudo", "su", "login",
    "slurmstepd", "srun", "sbatch", "docker-init", "tini", "dumb-init", "conmon", "runc",
    "pytest", "make", "code", "node", "supervisord",
})
MAX_ANCESTORS = 3
EXEC_GRACE_S = 3.0  # a process this young (by its start time) may still be between fork and exec
EXEC_REREAD_S = 0.9  # ... and how often in it: at the default tick (1 s) every tick, at faster ticks no more
THREADS_EVERY_S = 5.0
QUIET_REFRESH_S = 10.0
CHILD_EVERY_S = 5.0  # status and io of a quiet child of a rank (data loader, compile worker)
DEFAULT_JOB_ENV = ("MASTER_ADDR", "TORCHELASTIC_RUN_ID")
# Threads torch.distributed starts in every rank (gloo's and NCCL's): a process that has them is a
# rank even when it holds no GPU and its rank came as an argument (an inference server's workers).
DIST_THREAD = re.compile(r"^(pt_gloo|gloo_|pt_nccl|NCCL |ncclProxy|pt_c10d)")
DIST_SCAN_EVERY_S = 5.0
DIST_SCAN_FOR_S = 600.0  # look for such threads in a young process this long after it appeared
# A rank before its process group is up (imports and init can take tens of seconds) shows what it
# is by how it was started: its rank as an argument (the vLLM/SGLang shape, torch.distributed.launch's
# --local-rank), or as a child that multiprocessing's spawn started from a process that loaded torch
# (torch.multiprocessing.spawn, an inference server's schedulers). The second is weaker (a DataLoader
# with a spawn context looks the same): it holds only until the process is this old. A parent whose
# ranks-by-argument are exactly 1..N-1 is rank 0 itself (vLLM's engine process runs rank 0 and starts
# the others).
ARGV_RANK = re.compile(rb"(?:^|\0)--(?:local[-_]|tp[-_])?rank(?:=|\0)(\d+)(?:\0|$)")
SPAWN_CHILD = (b"from multiprocessing.spawn import spawn_main", b"from multiprocessing.forkserver import main")
SPAWN_HINT_S = 60.0
# The listing of /proc (every pid of the host) is skipped while no process was created since the
# last one: /proc/loadavg's last field is the pid the kernel handed out last, in the reader's pid
# namespace, which a fork (in any namespace below it too) always moves. Read only where that
# namespace is the one /proc shows (its NSpid names one pid); the listing still runs this often,
# so that the processes that exited unwatched are forgotten.
LIST_ALL_EVERY_S = 10.0
HINTED_SCAN_EVERY_S = 1.0  # how often a process taken for a rank-to-be is looked at for its threads
DIST_COMMS = ("python", "pt_main_thread", "pt_", "sglang", "vllm", "Vllm")  # names of processes that may run them


@dataclass
class _Known:
    ppid: int
    comm: str
    start_ticks: int
    seen: float = 0.0  # monotonic time hangd first saw it
    young_until: float = 0.0  # monotonic time it is EXEC_GRACE_S old (by its own start time)
    launch_read: float = -1e18  # when its command line and environment were last read (EXEC_GRACE_S)
    job_env: bool = False
    rank: str | None = None  # RANK from its environment, to tell a rank from its children
    info_sent: bool = False
    dist_threads: list[str] | None = None
    dist_scanned: float = -1e18
    dist_tids: set[str] = field(default_factory=set)  # thread ids the scan for them has read
    cmdline: bytes = b""
    argv_rank: int | None = None  # the rank its command line gives it (see ARGV_RANK)
    rank_zero: bool = False  # it started the ranks 1..N-1 by argument: it is rank 0
    spawned: bool = False  # multiprocessing's spawn started it from a torch process (see SPAWN_CHILD)
    torch: bool | None = None  # it has torch loaded (read only for the parents of spawned children)


@dataclass
class ProcSource:
    """Reads /proc for the watched set; ``proc_root`` is injectable for tests, and so are where a
    process's cgroup is read (``cgroup_path``, a path with ``{pid}``; empty: /proc/PID/cgroup) and
    the kubelet's pod log folders (``pod_log_dir``)."""

    proc_root: str = "/proc"
    cgroup_path: str = ""
    pod_log_dir: str = "/var/log/pods"
    env_keep: tuple[str, ...] = DEFAULT_ENV_KEEP
    job_env: tuple[str, ...] = DEFAULT_JOB_ENV
    extra_pids: set[int] = field(default_factory=set)
    name: str = "proc"
    _known: dict[int, _Known] = field(default_factory=dict)
    _watched: set[int] = field(default_factory=set)
    _btime: float | None = None
    _rank_parents: set[int] = field(default_factory=set)
    _threads_at: dict[int, tuple[float, dict[str, int]]] = field(default_factory=dict)
    _io_raw: dict[int, bytes] = field(default_factory=dict)
    _job_env_cache: tuple[tuple[str, ...], tuple[bytes, ...]] = ((), ())
    # pid -> (stat key, when everything was last read, last reading, when status and io were last read)
    _last: dict[int, tuple[tuple[object, ...], float, ProcSample, float]] = field(default_factory=dict)
    _fd_waits: FdWaits | None = None
    _cursor_ok: bool | None = None  # /proc/loadavg's last pid is of the namespace /proc shows
    _cursor: int | None = None  # ... as it was when /proc was last listed
    _listed_at: float = -1e18

    @property
    def _job_env_b(self) -> tuple[bytes, ...]:
        if self._job_env_cache[0] != self.job_env:
            self._job_env_cache = (self.job_env, tuple(k.encode() for k in self.job_env))
        return self._job_env_cache[1]

    def _p(self, pid: int, *parts: str) -> str:
        return f"{self.proc_root}/{pid}/" + "/".join(parts) if parts else f"{self.proc_root}/{pid}"

    def boot_time(self) -> float:
        if self._btime is None:
            text = _read(os.path.join(self.proc_root, "stat")) or ""
            for line in text.splitlines():
                if line.startswith("btime "):
                    self._btime = float(line.split()[1])
                    break
            else:
                self._btime = 0.0
        return self._btime

    def _last_pid(self) -> int | None:
        """The pid the kernel handed out last (see LIST_ALL_EVERY_S); None where it cannot be told."""
        if self._cursor_ok is None:
            status = _read(os.path.join(self.proc_root, "self", "status")) or ""
            nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            self._cursor_ok = len(nspid) == 1
        if not self._cursor_ok:
            return None
        text = _read(os.path.join(self.proc_root, "loadavg")) or ""
        last = text.rsplit(None, 1)[-1] if text.strip() else ""
        return int(last) if last.isdigit() else None

    def _list(self, now: float) -> set[int] | None:
        """Every pid of the host; None when no process was created since the last listing."""
        cursor = self._last_pid()  # before the listing: a fork during it shows at the next tick
        if cursor is not None and cursor == self._cursor and now - self._listed_at < LIST_ALL_EVERY_S:
            return None
        try:
            pids = {int(d) for d in os.listdir(self.proc_root) if d.isdigit()}
        except OSError as e:
            raise Unavailable(f"cannot list {self.proc_root}: {e}", "HINT: is /proc mounted?") from e
        self._cursor, self._listed_at = cursor, now
        return pids

    def _discover(self) -> None:
        now = time.monotonic()
        pids = self._list(now)
        if pids is not None:
            self._take_listing(pids, now)
        # A process caught between fork and exec still shows its parent's environment and command
        # line: look again while it is young (cheap: only processes first seen in the last few
        # seconds; after every new one is known, so that a child can be told from its parent).
        for pid, k in self._known.items():
            if now < k.young_until and now - k.launch_read >= EXEC_REREAD_S:
                k.launch_read = now
                if not k.job_env:
                    self._read_env(pid, k)
                self._read_launch(pid, k)
            # the cheap tests first: this runs for every process of the host, every tick
            if k.dist_threads is None and now - k.dist_scanned >= HINTED_SCAN_EVERY_S and now - k.seen < DIST_SCAN_FOR_S \
                    and k.comm.startswith(DIST_COMMS) \
                    and (now - k.dist_scanned >= DIST_SCAN_EVERY_S or self._hinted(k)) and not self._inherits_rank(k):
                k.dist_scanned = now
                k.dist_threads = self._dist_threads(pid, k.dist_tids)

    def _take_listing(self, pids: set[int], now: float) -> None:
        """Forget the processes gone from the listing; read the new ones' stat and environment."""
        for gone in (set(self._known) | set(self._last)) - pids:
            self._forget(gone)
        wall = time.time()
        for pid in pids - set(self._known):
            st = parse_stat(_read_bytes(self._p(pid, "stat"), small=True) or b"")
            if st is None:
                continue
            k = _Known(ppid=int(st["ppid"]), comm=str(st["comm"]), start_ticks=int(st["starttime_ticks"]),  # type: ignore[call-overload]
                       seen=now)
            # young by its own start: what ran before hangd started is long past its exec
            age = wall - self.boot_time() - k.start_ticks / CLK_TCK if self.boot_time() else 0.0
            k.young_until = now + max(0.0, EXEC_GRACE_S - age)
            self._read_env(pid, k)
            self._known[pid] = k

    def _read_launch(self, pid: int, k: _Known) -> None:
        """How it was started (see ARGV_RANK, SPAWN_CHILD): its command line, and for a spawned
        child whether its parent loaded torch (the parent's maps, read once)."""
        raw = _read_bytes(self._p(pid, "cmdline"))
        if not raw:
            return
        k.cmdline, k.argv_rank, k.spawned = raw, None, False
        parent = self._known.get(k.ppid)
        if parent is not None and (parent.cmdline or _read_bytes(self._p(k.ppid, "cmdline"))) == raw:
            return  # forked without exec (a DataLoader worker): its parent's command line, not its own
        m = ARGV_RANK.search(raw)
        k.argv_rank = int(m.group(1)) if m else None
        if m is None and any(m in raw for m in SPAWN_CHILD) and parent is not None:
            if parent.torch is None:
                maps = _read_bytes(self._p(k.ppid, "maps"))
                parent.torch = maps is not None and b"libtorch" in maps
            k.spawned = parent.torch

    def _hinted(self, k: _Known) -> bool:
        """Taken for a rank before its threads show: by its arguments, or (for a while) by how it was spawned."""
        return k.argv_rank is not None or k.rank_zero or (k.spawned and time.time() - self.boot_time() - k.start_ticks / CLK_TCK < SPAWN_HINT_S)

    def _forget(self, pid: int) -> None:
        """Everything kept about ``pid``, in one place: a process seen to vanish in any way (gone
        from the listing, or between the listing and its read) leaves nothing behind."""
        self._known.pop(pid, None)
        self._threads_at.pop(pid, None)
        self._last.pop(pid, None)
        self._io_raw.pop(pid, None)

    def _inherits_rank(self, k: _Known) -> bool:
        """Its parent has its RANK: a data loader or compile worker forked by a rank. Such a child
        is never taken for a rank, whatever threads it runs (see ``_role``), so the scan for
        torch.distributed threads (a file read per thread, ~1 ms for 64 threads) is spared."""
        parent = self._known.get(k.ppid)
        return k.rank is not None and parent is not None and parent.rank == k.rank

    def _dist_threads(self, pid: int, seen: set[str] | None = None) -> list[str] | None:
        """Names of torch.distributed threads of ``pid`` (None when it has none). ``seen``: the
        thread ids an earlier scan read, skipped and added to. A thread is named as it starts
        (gloo's, NCCL's), so only new threads can bring a new name: a torch process with a
        hundred threads costs one directory listing a scan, not a hundred reads."""
        try:
            tids = os.listdir(self._p(pid, "task"))
        except OSError:
            return None
        if len(tids) < 3:
            return None
        if seen is not None:
            new = [t for t in tids if t not in seen]
            seen.update(new)
            tids = new
        names = set()
        for tid in tids:
            name = (_read(self._p(pid, "task", tid, "comm")) or "").strip()
            if DIST_THREAD.match(name):
                names.add(name)
        return sorted(names) or None

    def _read_env(self, pid: int, k: _Known) -> None:
        raw = _read_bytes(self._p(pid, "environ"))
        if raw:
            # searched in place, not split into a dict: every process new on the host comes here,
            # and a compiling job starts thousands
            env = b"\0" + raw + b"\0"
            k.job_env = any(b"\0" + key + b"=" in env or b"\0" + key + b"\0" in env for key in self._job_env_b)
            i = env.rfind(b"\0RANK=")  # the last one, as a dict of the environment would keep
            if i >= 0:
                k.rank = env[i + 6 : env.index(b"\0", i + 6)].decode("utf-8", "replace")
            elif b"\0RANK\0" in env:
                k.rank = ""

    def watched(self, gpu_pids: Iterable[int]) -> set[int]:
        """The pids to read this tick."""
        self._discover()
        by_parent: dict[int, set[int]] = {}
        for k in self._known.values():
            if k.argv_rank is not None:
                by_parent.setdefault(k.ppid, set()).add(k.argv_rank)
        for ppid, ranks in by_parent.items():
            parent = self._known.get(ppid)
            if parent is not None and parent.argv_rank is None:
                parent.rank_zero = ranks == set(range(1, max(ranks) + 1))
        seeds = {p for p in gpu_pids if p in self._known} | \
            {p for p, k in self._known.items() if k.job_env or k.dist_threads or self._hinted(k)}
        seeds |= {p for p in self.extra_pids if p in self._known}
        children: dict[int, list[int]] = {}
        for pid, k in self._known.items():
            children.setdefault(k.ppid, []).append(pid)
        out = set(seeds)
        for pid in seeds:  # ancestors up to the launcher
            cur = self._known[pid].ppid
            for _ in range(MAX_ANCESTORS):
                anc = self._known.get(cur)
                if anc is None or cur <= 1 or anc.comm in STOP_COMMS:
                    break
                out.add(cur)
                cur = anc.ppid
        stack = list(seeds)
        while stack:  # descendants (compile workers, dataloaders)
            for c in children.get(stack.pop(), []):
                if c not in out:
                    out.add(c)
                    stack.append(c)
        # keep watching what we watched while it exists: a rank re-parented to init is an orphan
        out |= {p for p in self._watched if p in self._known}
        return out

    def read_sample(self, pid: int, role: str | None = None) -> ProcSample | None:
        """One reading of ``pid``; ``role`` (as ``_role`` names it) decides how often the files
        that did not move are read again: see below."""
        raw = _read_bytes(self._p(pid, "stat"), small=True)
        f = _stat_fields(raw) if raw is not None else None
        if f is None:
            return None
        comm_b, rest = f
        state = rest[0].decode()
        utime, stime, threads = int(rest[11]), int(rest[12]), int(rest[17])
        rss = int(rest[21]) * PAGE_SIZE
        now = time.monotonic()
        prev = self._last.get(pid)
        old = prev[2] if prev is not None else None
        # the previous reading's objects where the values did not change: a quiet process's
        # history (600 readings each) then holds one copy, not 600
        if old is not None:
            utime = old.utime if old.utime == utime else utime
            stime = old.stime if old.stime == stime else stime
            rss = old.rss_bytes if old.rss_bytes == rss else rss
        comm = old.comm if old is not None and old.comm is not None and old.comm.encode() == comm_b \
            else comm_b.decode("utf-8", "replace")
        start = old.start_time if old is not None and old.start_time is not None and prev is not None \
            and prev[0][5] == rest[19] else self.boot_time() + int(rest[19]) / CLK_TCK
        s = ProcSample(pid=pid, ppid=int(rest[1]), comm=comm, state=state, utime=utime, stime=stime, threads=threads,
                       rss_bytes=rss, start_time=start, clk_tck=CLK_TCK)
        # A process whose stat did not move (same CPU time, state, threads, memory) did nothing
        # since the last tick: reuse the rest of its last reading instead of four more reads, and
        # read everything anyway every QUIET_REFRESH_S. Most watched processes sleep most of the time.
        key = (state, utime, stime, threads, rss, rest[19])
        if prev is not None and old is not None and prev[0] == key and now - prev[1] < QUIET_REFRESH_S and state != "D":
            s.swap_bytes, s.wchan = old.swap_bytes, old.wchan
            s.thread_states = old.thread_states  # never changed in place: shared, not copied
            # The I/O counters and context switches of ranks (and of whatever holds a GPU or is
            # not known as a child) are read every tick even so: whose write a log's growth was
            # needs the first, and a collective that completes 20 times a second on a few
            # microseconds of CPU (an idle server's loop) shows only in the second. A rank's child
            # (data loader, compile worker) whose stat did not move reads them every CHILD_EVERY_S:
            # no decision waits on its wake-ups, and a node runs many of them.
            if role == Role.CHILD and now - prev[3] < CHILD_EVERY_S:
                s.voluntary_ctxt_switches = old.voluntary_ctxt_switches
                s.nonvoluntary_ctxt_switches = old.nonvoluntary_ctxt_switches
                s.io = old.io
                return s
            self._read_status(pid, s)
            io = _read_bytes(self._p(pid, "io"), small=True)
            s.io = self._io(pid, io, old) if io else old.io
            self._last[pid] = (key, prev[1], s, now)
            return s
        self._read_details(pid, s, old)
        self._last[pid] = (key, now, s, now)
        return s

    def _io(self, pid: int, raw: bytes, old: ProcSample | None) -> dict[str, int]:
        """/proc/PID/io parsed, or the last reading's dict when the file reads the same (no parse,
        no new objects: the counters of a process that waits stand still)."""
        if old is not None and old.io is not None and self._io_raw.get(pid) == raw:
            return old.io
        self._io_raw[pid] = raw
        return _parse_io(raw)

    def _read_status(self, pid: int, s: ProcSample) -> None:
        raw = _read_bytes(self._p(pid, "status"), small=True)
        if raw:
            s.voluntary_ctxt_switches = _status_field(raw, b"\nvoluntary_ctxt_switches:")
            s.nonvoluntary_ctxt_switches = _status_field(raw, b"\nnonvoluntary_ctxt_switches:")
            swap = _status_field(raw, b"\nVmSwap:")
            if swap is not None:
                s.swap_bytes = swap * 1024

    def _read_details(self, pid: int, s: ProcSample, old: ProcSample | None = None) -> None:
        self._read_status(pid, s)
        io = _read_bytes(self._p(pid, "io"), small=True)
        if io:
            s.io = self._io(pid, io, old)
        wchan = _read(self._p(pid, "wchan"))
        if wchan is not None:
            s.wchan = wchan.strip() or "0"
            if old is not None and old.wchan == s.wchan:
                s.wchan = old.wchan
        if s.state == "Z":
            s.thread_states = {"Z": 1}
        else:
            s.thread_states = self._thread_states(pid, s.threads or 0)
            if old is not None and old.thread_states == s.thread_states:
                s.thread_states = old.thread_states

    def _thread_states(self, pid: int, nthreads: int) -> dict[str, int] | None:
        """Per-thread state counts. A process with hundreds of threads (an inference server has
        200+) is read every THREADS_EVERY_S seconds, a small one every tick."""
        now = time.monotonic()
        last = self._threads_at.get(pid)
        if last is not None and nthreads > 32 and now - last[0] < THREADS_EVERY_S:
            return dict(last[1])
        counts: dict[str, int] = {}
        try:
            tids = os.listdir(self._p(pid, "task"))
        except OSError:
            tids = []
        for tid in tids:
            text = _read(self._p(pid, "task", tid, "stat"))
            if text:
                rp = text.rfind(")")
                st = text[rp + 2 : rp + 3] if rp > 0 else ""
                if st:
                    counts[st] = counts.get(st, 0) + 1
        self._threads_at[pid] = (now, counts)
        return counts or None

    def read_info(self, pid: int) -> ProcInfo | None:
        st = parse_stat(_read_bytes(self._p(pid, "stat"), small=True) or b"")
        if st is None:
            return None
        info = ProcInfo(pid=pid, ppid=int(st["ppid"]))  # type: ignore[call-overload]
        info.start_time = self.boot_time() + int(st["starttime_ticks"]) / CLK_TCK  # type: ignore[call-overload]
        try:
            info.exe = os.readlink(self._p(pid, "exe"))
        except OSError:
            pass
        try:
            info.cwd = os.readlink(self._p(pid, "cwd"))
        except OSError:
            pass
        raw = _read_bytes(self._p(pid, "cmdline"))
        if raw:
            info.cmdline = redact_cmdline(a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0"))
        env = _read_bytes(self._p(pid, "environ"))
        if env is not None:
            info.environ = filter_environ(parse_environ(env), self.env_keep)
        fds: dict[str, str | None] = {}
        for fd in ("1", "2"):
            try:
                fds[fd] = os.readlink(self._p(pid, "fd", fd))
            except OSError:
                fds[fd] = None
        info.fds = fds
        status = _read_bytes(self._p(pid, "status"), small=True)
        if status:
            info.uid = status_uid(status)
            info.user = user_name(info.uid) if info.uid is not None else None
        cg = _read(self.cgroup_path.format(pid=pid) if self.cgroup_path else self._p(pid, "cgroup"))
        if cg:
            info.cgroup = describe_cgroup(cg)
            pod = parse_kube_cgroup(cg)
            if pod is not None:
                info.pod = PodResolver(self.pod_log_dir).resolve(pod, info.environ)
        return info

    def _role(self, pid: int, k: _Known, watched: set[int], gpu_pids: set[int]) -> Role:
        """worker (a rank), launcher (the parent of ranks) or child (compile workers, data loaders:
        they inherit a rank's environment but are not ranks)."""
        anc, cur = [], k.ppid
        for _ in range(MAX_ANCESTORS + 1):
            a = self._known.get(cur)
            if a is None or cur <= 1:
                break
            anc.append(cur)
            cur = a.ppid
        if k.rank is not None and any(self._known[a].rank == k.rank for a in anc):
            return Role.CHILD  # it inherited a rank's environment (data loader, compile worker)
        if pid in gpu_pids or k.dist_threads or k.argv_rank is not None or k.rank_zero:
            return Role.WORKER  # its own GPU memory, gloo/NCCL threads or rank argument, whatever its ancestors hold
        if any(a in gpu_pids or self._known[a].dist_threads or self._hinted(self._known[a]) for a in anc):
            return Role.CHILD  # started by a rank: a data loader, a compile worker, a pool
        if self._hinted(k):
            return Role.WORKER

        if pid in self._rank_parents:
            return Role.LAUNCHER
        return Role.WORKER if k.job_env else Role.CHILD

    def collect(self, snap: Snapshot) -> None:
        gpu_pids = {p.pid for g in snap.gpus for p in g.procs}
        watched = self.watched(gpu_pids)
        # the parents of ranks; a child that inherited its parent's RANK (a DataLoader worker) makes
        # its parent no launcher
        self._rank_parents = {k.ppid for c in watched if (k := self._known.get(c)) is not None
                              and (c in gpu_pids or k.job_env or self._hinted(k)) and not self._inherits_rank(k)} - \
            {p for p, k in self._known.items() if k.rank_zero}
        for pid in sorted(watched):
            known = self._known.get(pid)
            role = self._role(pid, known, watched, gpu_pids) if known is not None else None
            s = self.read_sample(pid, role)
            if s is None or known is None:
                snap.procs.append(ProcSample(pid=pid, gone=True))
                self._forget(pid)
                continue
            s.role = role
            s.dist_threads = known.dist_threads
            if not known.info_sent:
                info = self.read_info(pid)
                if info is not None:
                    snap.infos.append(info)
                known.info_sent = True
            known.ppid = s.ppid if s.ppid is not None else known.ppid
            snap.procs.append(s)
        if self._fd_waits is None:
            self._fd_waits = FdWaits(self.proc_root)
        self._fd_waits.collect(snap.procs, watched)
        for pid in self._watched - watched:
            if pid not in self._known:
                snap.procs.append(ProcSample(pid=pid, gone=True))
        self._watched = {p for p in watched if p in self._known}
