"""Flight-recorder discovery: where each rank's dumps and dump pipe are, and fresh dumps.

PyTorch writes dumps to ``<prefix><global rank>``. The prefix comes from the process's own
environment (``TORCH_FR_DUMP_TEMP_FILE``, older ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``) or the default of
its torch version: ``/tmp/nccl_trace_rank_`` (<= 2.6), ``~/.cache/torch/nccl_trace_rank_`` (2.7-2.8),
``${XDG_CACHE_HOME:-$HOME/.cache}/torch/comm_lib_trace_rank_`` (current). With
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>`` each rank reads a FIFO ``<stem><rank>.pipe``: one byte
written there makes that rank dump without stopping it. Parsing is hangd.flightrec's job.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass, field

from hangd.safefile import NotRegularFile, TooLarge, read_regular
from hangd.snapshot import FrDump, ProcInfo, Snapshot

MAX_DUMP_BYTES = 64 * 1024 * 1024
GONE_GRACE_S = 60.0
DEFAULTS_EVERY_S = 5.0


def dump_prefixes(env: dict[str, str]) -> list[str]:
    """Candidate dump prefixes for a process, most specific first."""
    for key in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        if env.get(key):
            return [env[key]]
    home = env.get("HOME") or "/root"
    cache = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return [
        os.path.join(cache, "torch", "comm_lib_trace_rank_"),
        os.path.join(home, ".cache", "torch", "nccl_trace_rank_"),
        "/tmp/nccl_trace_rank_",
    ]


MAX_UNRANKED = 1024  # processes kept whose rank may come from the analysis (FlightSource.teach)
# What sets up a process's flight recorder: its dump files, its dump pipe, its buffer.
FR_KEYS = ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
           "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def pipe_path(env: dict[str, str], rank: int) -> str | None:
    stem = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    return f"{stem}{rank}.pipe" if stem else None


def read_capped(path: str, cap: int = MAX_DUMP_BYTES) -> tuple[bytes | None, str | None]:
    """Read a file without following a symlink, at most ``cap`` bytes. (data, error)."""
    try:
        return read_regular(path, cap)[0], None
    except (NotRegularFile, TooLarge) as e:
        return None, f"{path}: {e}"
    except OSError as e:
        return None, f"{path}: {os.strerror(e.errno) if e.errno else e}"


@dataclass
class _Rank:
    pid: int
    rank: int
    prefixes: list[str]
    pipe: str | None
    gone_at: float | None = None
    explicit: bool = False  # the env names the dump file


@dataclass
class FlightSource:
    name: str = "flight_recorder"
    proc_root: str = "/proc"
    _ranks: dict[int, _Rank] = field(default_factory=dict)
    _seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    _defaults_at: float = 0.0
    _unranked: dict[int, dict[str, str]] = field(default_factory=dict)  # pid -> env, flight recorder set up, no RANK

    def _in_root(self, pid: int, path: str) -> str:
        inside = os.path.join(self.proc_root, str(pid), "root") + path
        return inside if os.path.lexists(inside) else path

    def learn(self, info: ProcInfo) -> None:
        self._unranked.pop(info.pid, None)  # a pid reused: what was kept of the one before goes
        env = info.environ or {}
        rank_s = env.get("RANK")
        if rank_s is None or not rank_s.isdigit():
            if any(env.get(k) for k in FR_KEYS):
                self._unranked[info.pid] = env  # its rank may come from the analysis (``teach``)
            return
        self._add(info.pid, int(rank_s), env)

    def _add(self, pid: int, rank: int, env: dict[str, str]) -> None:
        explicit = bool(env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"))
        self._ranks[pid] = _Rank(pid, rank, dump_prefixes(env), pipe_path(env, rank), explicit=explicit)

    def teach(self, ranks: dict[int, int]) -> None:
        """Ranks the analysis knows of processes whose environment has no RANK but sets up the
        flight recorder: a server's schedulers started with their rank as an argument
        (``sglang::scheduler_TP3``), whose dump pipe and files are named by that rank. Only ranks
        known on evidence (an argument, a log prefix) are taught, never a guess by start order."""
        for pid, rank in ranks.items():
            env = self._unranked.get(pid)
            if env is not None and (pid not in self._ranks or self._ranks[pid].rank != rank):
                self._add(pid, rank, env)  # again when the analysis learned better (a log prefix)

    def locations(self) -> dict[int, dict[str, object]]:
        """pid -> where its dumps and pipe are (for the API and evidence)."""
        return {pid: {"rank": r.rank, "dump_paths": [p + str(r.rank) for p in r.prefixes], "pipe": r.pipe}
                for pid, r in self._ranks.items()}

    def has_pipe(self, pid: int) -> bool:
        r = self._ranks.get(pid)
        return bool(r and r.pipe and os.path.exists(self._in_root(pid, r.pipe)))

    def request_dump(self, pid: int) -> str | None:
        """Ask one rank to dump through its debug pipe (no signal, the job keeps running).
        Returns None on success or why it could not."""
        r = self._ranks.get(pid)
        if r is None or not r.pipe:
            return "no dump pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE unset)"
        path = self._in_root(pid, r.pipe)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as e:
            if e.errno == errno.ENXIO:
                return f"{r.pipe}: nobody reads the pipe"
            return f"{r.pipe}: {os.strerror(e.errno) if e.errno else e}"
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return f"{r.pipe}: not a FIFO"
            os.write(fd, b"1")
            return None
        finally:
            os.close(fd)

    def collect(self, snap: Snapshot) -> None:
        for info in snap.infos:
            self.learn(info)
        # PyTorch's watchdog dumps and then aborts the process: keep looking for a rank's dump for
        # a while after it is gone (through the path as hangd sees it, the process's root is gone).
        now = time.monotonic()
        if len(self._unranked) > MAX_UNRANKED:  # pids that left unseen (no "gone" reading): the oldest go
            for pid in list(self._unranked)[: len(self._unranked) - MAX_UNRANKED]:
                del self._unranked[pid]
        for p in snap.procs:
            if p.gone:
                self._unranked.pop(p.pid, None)
            if p.gone and p.pid in self._ranks and self._ranks[p.pid].gone_at is None:
                self._ranks[p.pid].gone_at = now
        for pid in [pid for pid, r in self._ranks.items() if r.gone_at is not None and now - r.gone_at > GONE_GRACE_S]:
            del self._ranks[pid]
        # Where the job names its dump file, look every tick; torch's default places (three per
        # rank, through the job's root) every few seconds.
        defaults_due = now - self._defaults_at >= DEFAULTS_EVERY_S
        if defaults_due:
            self._defaults_at = now
        for pid, r in self._ranks.items():
            if not r.explicit and not defaults_due:
                continue
            for prefix in r.prefixes:
                path = prefix + str(r.rank)
                real = self._in_root(pid, path)
                try:
                    st = os.lstat(real)
                except OSError:
                    continue
                key = (int(st.st_mtime_ns), st.st_size)
                if self._seen.get(path) == key:
                    break
                self._seen[path] = key
                data, err = read_capped(real)
                snap.fr_dumps.append(FrDump(pid=pid, rank=r.rank, format="torch-fr", path=path,
                                            data=data, source="file" if err is None else f"file: {err}"))
                break
