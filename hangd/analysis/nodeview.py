"""The node's recent history, fed one snapshot at a time: ``NodeView`` with a ``ProcHistory`` per
process, a ``FileState`` per log, and how log lines are classified (the log catalog, exception lines).

Everything here is computed from snapshots only (no /proc, no NVML).
"""

from __future__ import annotations

import re
import tomllib
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, TypeVar

from hangd.analysis.hardware import HardwareLog
from hangd.analysis.thresholds import Thresholds
from hangd.snapshot import FileSample, GpuSample, ProcInfo, ProcSample, Snapshot, StackSample

T = TypeVar("T")

COMPILE_COMMS = re.compile(r"^(ptxas|cc1|cc1plus|nvcc|cicc|gcc|g\+\+|clang|ld|as|ninja|compile_worker|triton)", re.I)


@lru_cache(maxsize=1)
def log_catalog() -> dict[str, re.Pattern[str]]:
    data = tomllib.loads(resources.files("hangd.analysis").joinpath("catalog.toml").read_text())
    out = {}
    for kind, pats in (data.get("log") or {}).items():
        out[kind] = re.compile("|".join(f"(?:{p if p.startswith('^') else re.escape(p)})" for p in pats), re.M)
    return out


def classify_log_lines(text: str) -> tuple[int, set[str]]:
    """(bytes of lines that are not diagnostic, phase kinds the lines name). A traceback, its
    source lines and its last line ("RuntimeError: ...") included, is no progress either: it is
    what a dying thread prints."""
    cat = log_catalog()
    diag = cat.get("diagnostic")
    useful = 0
    kinds: set[str] = set()
    dying = set(exception_lines(text))
    in_tb = False
    for line in text.splitlines():
        if line.lstrip("[rank0123456789]: ").startswith("Traceback (most recent call last)"):
            in_tb = True
        if line.strip()[:500] in dying:
            in_tb = False
            continue
        if not line.strip() or in_tb:
            continue
        if diag is not None and diag.search(line):
            continue
        useful += len(line) + 1
        named = {kind for kind, pat in cat.items() if pat.search(line)}  # not "diagnostic": passed over above
        if "graph_capture_end" in named:
            named.discard("graph_capture")  # "Capture cuda graph end": the capture is over
            kinds.discard("graph_capture")  # ... and so are the capture's lines before it
        kinds |= named
    return useful, kinds


@dataclass
class FileState:
    size: int | None = None
    grew_at: float | None = None  # last time non-diagnostic lines appeared
    kinds_at: dict[str, float] = field(default_factory=dict)  # phase kind -> last time seen
    tail: str = ""
    # exception lines (the last line of a traceback, "RuntimeError: ..."), with when they appeared;
    # None as the time: already in the file when hangd first read it
    exceptions: deque[tuple[float | None, str]] = field(default_factory=lambda: deque(maxlen=Thresholds.exceptions_kept))
    changed_at: float | None = None  # when its size last changed
    unfinished: str | None = None  # the exception line judged before its newline came, if any


# The last line of a Python traceback: "RuntimeError: mat1 and mat2 shapes cannot be multiplied".
EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)"
                            r"(?::\s.*)?)\s*$")


def exception_lines(text: str) -> list[str]:
    """Exception lines of a traceback in ``text``; lines inside a traceback's frames do not count."""
    out = []
    in_tb = False
    for line in text.splitlines():
        if line.lstrip("[rank0123456789]: ").startswith("Traceback (most recent call last)"):
            in_tb = True
            continue
        m = EXCEPTION_LINE.match(line)
        if m and (in_tb or ": " in m.group(1)):
            # whole, with a "[rankN]:" prefix: in a log the ranks share, it says whose exception it is
            out.append(line.strip()[:500])
            in_tb = False
    return out


def _unfinished_exception(tail: str) -> str:
    """The exception line a log's last, unfinished line is (no newline after it), or ""."""
    if not tail or tail.endswith("\n"):
        return ""
    found = exception_lines(tail)
    return found[-1] if found and found[-1] == tail.rsplit("\n", 1)[-1].strip()[:500] else ""


@dataclass
class ProcHistory:
    pid: int
    first_seen: float
    # Thresholds.history_readings of them; what needs older readings is remembered instead (``wrote``)
    samples: deque[tuple[float, ProcSample]] = field(default_factory=lambda: deque(maxlen=Thresholds.history_readings))
    wrote: dict[tuple[float, float], bool | None] = field(default_factory=dict)
    info: ProcInfo | None = None
    stacks: list[tuple[float, list[StackSample]]] = field(default_factory=list)
    first_ppid: int | None = None
    gone_at: float | None = None
    zombie_since: float | None = None
    threads_lost: tuple[float, int, int] | None = None  # (when, threads before, after) of the last drop
    # when its main thread last woke (its voluntary context switches moved), or was first counted
    woke_at: float | None = None
    _logs: tuple[ProcInfo | None, frozenset[str]] = (None, frozenset())
    _memo: tuple[ProcInfo | None, dict[str, Any]] | None = None

    def latest(self) -> ProcSample | None:
        return self.samples[-1][1] if self.samples else None

    def memo_of_info(self, name: str, fn: Callable[[ProcHistory], T]) -> T:
        """``fn(self)`` for a function of its static facts alone (``info``): worked out once per
        ``info``, not at every tick that asks."""
        if self._memo is None or self._memo[0] is not self.info:
            self._memo = (self.info, {})
        memo = self._memo[1]
        if name not in memo:
            memo[name] = fn(self)
        return memo[name]

    def logs(self) -> frozenset[str]:
        """``info.log_files()``, worked out once per ``info``: every tick asks it of every process."""
        if self._logs[0] is not self.info:
            self._logs = (self.info, frozenset(self.info.log_files()) if self.info is not None else frozenset())
        return self._logs[1]


def _compile_cmd(h: ProcHistory) -> bool:
    """Its command line names a compile worker (inductor's pool)."""
    cmd = " ".join(h.info.cmdline or []) if h.info else ""
    return "compile_worker" in cmd or "_inductor" in cmd


class NodeView:
    """The recent history of a node, fed one snapshot at a time."""

    def __init__(self, th: Thresholds | None = None) -> None:
        self.th = th or Thresholds()
        self.t = 0.0
        self.procs: dict[int, ProcHistory] = {}
        self.gpus: dict[int, deque[tuple[float, GpuSample]]] = {}
        self.files: dict[str, FileState] = {}
        self.gpu_of: dict[int, dict[int, int | None]] = {}  # pid -> {gpu index: bytes}
        self.gpu_seen_at: dict[int, float] = {}
        self.new_stacks: list[int] = []
        self.gpu_baseline: dict[int, int] = {}
        self.compile_children: dict[int, int] = {}
        self.log_ranks: dict[int, int] = {}  # pid -> rank from torch's "[rankN]" log prefix
        self.writers: dict[str, int] = {}  # log file -> how many live watched processes write to it
        self.hw = HardwareLog()  # XIDs and which GPU each process used, kept longer than the readings
        # answers worked out once a snapshot, asked many times by its analysis: cleared by ``feed``
        self._kids: dict[int, list[int]] | None = None
        self._works: dict[tuple[int, float], bool] = {}
        self.per_tick: dict[tuple[object, ...], object] = {}
        # identity.group_jobs's last answer, with what it was worked out from
        self.jobs_memo: tuple[object, dict[str, Any]] | None = None
        # GPU index -> reading's time -> (the reading, shows work, shows a spin, memory beyond its
        # processes'): signals.reading_marks, judged once a reading; trimmed with the readings
        self.gpu_marks: dict[int, dict[float, tuple[GpuSample, bool, bool, int | None]]] = {}

    def feed(self, snap: Snapshot) -> None:
        """Take in one snapshot: its GPU readings, process readings and infos, files and stacks."""
        t = snap.t
        self.t = max(self.t, t)
        self.new_stacks = []
        self._kids, self._works, self.per_tick = None, {}, {}
        if snap.gpus:
            self._feed_gpus(snap.gpus, t)
            self.hw.feed(snap)
        for info in snap.infos:
            h = self._proc(info.pid, t)
            h.info = info
            if h.first_ppid is None:
                h.first_ppid = info.ppid
        for p in snap.procs:
            self._feed_proc(p, t)
        for f in snap.files:
            self._file(f, t)
        if snap.stacks:
            by_pid: dict[int, list[StackSample]] = {}
            for s in snap.stacks:
                by_pid.setdefault(s.pid, []).append(s)
            for pid, ss in by_pid.items():
                h = self._proc(pid, t)
                h.stacks.append((t, ss))
                del h.stacks[:-self.th.stacks_kept]
                self.new_stacks.append(pid)
        if snap.procs:
            self._count_compile_workers()
            self._count_writers()
        self._trim_marks()
        self._trim(t)

    def _feed_gpus(self, gpus: list[GpuSample], t: float) -> None:
        """The GPUs' readings, which process holds memory on which GPU, each idle GPU's baseline."""
        self.gpu_of = {}
        for g in gpus:
            dq = self.gpus.get(g.index)
            if dq is None:
                dq = self.gpus[g.index] = deque(maxlen=self.th.gpu_history_readings)
            dq.append((t, g))
            for gp in g.procs:
                self.gpu_of.setdefault(gp.pid, {})[g.index] = gp.used
                self.gpu_seen_at[gp.pid] = t
            if not g.procs and g.mem_used is not None:
                base = self.gpu_baseline.get(g.index)
                self.gpu_baseline[g.index] = g.mem_used if base is None else min(base, g.mem_used)

    def _feed_proc(self, p: ProcSample, t: float) -> None:
        """One process's reading into its history: threads lost, when it last woke, zombie since."""
        if p.gone:
            gone = self.procs.get(p.pid)
            if gone is not None:  # a process never seen (or long forgotten) leaves no history
                gone.gone_at = gone.gone_at or t
            return
        h = self._proc(p.pid, t)
        h.gone_at = None
        if h.first_ppid is None:
            h.first_ppid = p.ppid
        last = h.latest()
        if last is not None and last.threads is not None and p.threads is not None and p.threads < last.threads:
            h.threads_lost = (t, last.threads, p.threads)
        vol = p.voluntary_ctxt_switches
        if vol is None:
            h.woke_at = None
        elif h.woke_at is None or last is None or last.voluntary_ctxt_switches != vol:
            h.woke_at = t
        h.samples.append((t, p))
        if p.state == "Z":
            h.zombie_since = h.zombie_since or t
        else:
            h.zombie_since = None

    def _count_writers(self) -> None:
        self.writers = {}
        for h in self.procs.values():
            if h.gone_at is None:
                for target in h.logs():
                    self.writers[target] = self.writers.get(target, 0) + 1

    def _count_compile_workers(self) -> None:
        """Compiler processes (ptxas, cc1, inductor compile workers) counted for each ancestor."""
        self.compile_children = {}
        for h in self.procs.values():
            lp = h.latest()
            if lp is None or h.gone_at is not None:
                continue
            if not (bool(lp.comm and COMPILE_COMMS.search(lp.comm)) or h.memo_of_info("compile_cmd", _compile_cmd)):
                continue
            # a warm pool of compile workers sits idle after compiling: count only busy ones
            if len(h.samples) >= 2:
                (t0, a), (t1, b) = h.samples[-2], h.samples[-1]
                used = b.cpu_seconds_between(a)
                if used is None or t1 <= t0 or used / (t1 - t0) < self.th.compile_worker_cores:
                    continue
            elif lp.comm and not COMPILE_COMMS.search(lp.comm):
                continue
            cur = lp.ppid
            for _ in range(self.th.compile_worker_depth):
                if not cur or cur <= 1:
                    break
                self.compile_children[cur] = self.compile_children.get(cur, 0) + 1
                parent = self.procs.get(cur)
                pl = parent.latest() if parent else None
                cur = pl.ppid if pl else None

    def _proc(self, pid: int, t: float) -> ProcHistory:
        h = self.procs.get(pid)
        if h is None:
            h = self.procs[pid] = ProcHistory(pid=pid, first_seen=t, samples=deque(maxlen=self.th.history_readings))
        return h

    def _file(self, f: FileSample, t: float) -> None:
        st = self.files.get(f.path)
        if st is None:
            st = self.files[f.path] = FileState(exceptions=deque(maxlen=self.th.exceptions_kept))
        if f.size is None:
            return
        if st.size is not None and f.size > st.size:
            new = ""
            if f.tail is not None:
                grown = f.size - st.size
                start = max(0, len(f.tail) - grown)
                # judge whole lines: back up to the start of the line the new bytes continue
                nl = f.tail.rfind("\n", 0, start)
                new = f.tail[nl + 1 :] if start > 0 else f.tail
                if start > 0 and nl < 0 and len(f.tail) < f.size:  # the line began before the tail we have: drop it
                    new = new.partition("\n")[2]
                # an unfinished last line is judged when it is complete
                new = new[: new.rfind("\n") + 1]
            useful, kinds = classify_log_lines(new) if f.tail is not None else (f.size - st.size, set())
            if useful > 0:
                st.grew_at = t
            for k in kinds:
                st.kinds_at[k] = t
            for line in exception_lines(new):
                if st.unfinished and line.startswith(st.unfinished) and st.exceptions \
                        and st.exceptions[-1][1] == st.unfinished:
                    st.exceptions[-1] = (st.exceptions[-1][0], line)  # the line judged unfinished, whole now
                else:
                    st.exceptions.append((t, line))
            st.unfinished = None
        elif st.size is not None and f.size == st.size and st.unfinished is None \
                and t - (st.changed_at or t) >= self.th.log_unfinished_line_s:
            # the last line never got its newline: judge it as it stands, once, as of when it was
            # written (a live source sends no tail while the size stands still: the one kept)
            st.unfinished = _unfinished_exception(f.tail if f.tail is not None else st.tail)
            if st.unfinished:
                st.exceptions.append((st.changed_at, st.unfinished))
        elif st.size is None and f.tail:
            for line in exception_lines(f.tail)[-3:]:
                st.exceptions.append((None, line))
            st.unfinished = _unfinished_exception(f.tail)  # already judged, as of before hangd read it
        if f.tail is not None:
            st.tail = f.tail
        if f.size != st.size:
            st.changed_at = t
        st.size = f.size

    def _trim_marks(self) -> None:
        for index, memo in self.gpu_marks.items():
            dq = self.gpus.get(index)
            if dq and len(memo) > len(dq) + 64:
                oldest = dq[0][0]
                self.gpu_marks[index] = {tt: m for tt, m in memo.items() if tt >= oldest}

    def _trim(self, t: float) -> None:
        """Bound memory: a process gone for ``gone_after_s`` leaves, and with it what is kept by
        its pid or by the logs only it wrote (a node that starts jobs all day sees a new pid, and
        often a new log file, every few seconds)."""
        gone = [p for p, h in self.procs.items() if h.gone_at is not None and t - h.gone_at > self.th.gone_after_s]
        for pid in gone:
            del self.procs[pid]
            self.log_ranks.pop(pid, None)
        if not gone:
            return
        # every reader compares against a few seconds ago: an older sighting says nothing
        recent = max(self.th.gpu_seen_s, self.th.orphan_gpu_s)
        for pid in [p for p, at in self.gpu_seen_at.items() if t - at > recent and p not in self.procs]:
            del self.gpu_seen_at[pid]
        # a log is read through the processes that write it (their fds): one no process here
        # writes is never read again
        written = {target for h in self.procs.values() for target in h.logs()}
        for path in [p for p in self.files if p not in written]:
            del self.files[path]

    # ------------------------------------------------------------------ queries

    def gpu_window_t(self, index: int, t: float, window: float) -> list[tuple[float, GpuSample]]:
        dq = self.gpus.get(index)
        if not dq:
            return []
        out = []
        for tt, g in reversed(dq):  # newest first: stop as soon as the window is passed
            if tt < t - window - 1e-6:
                break
            if tt <= t + 1e-6:
                out.append((tt, g))
        out.reverse()
        return out

    def gpu_window(self, index: int, t: float, window: float) -> list[GpuSample]:
        return [g for _, g in self.gpu_window_t(index, t, window)]

    def children(self, pid: int) -> list[int]:
        """Live processes it started (DataLoader workers, pool processes, subprocesses)."""
        if self._kids is None:  # one pass over the processes a snapshot, not one per question
            self._kids = {}
            for c, h in self.procs.items():
                if h.gone_at is None and (lp := h.latest()) is not None and lp.ppid is not None \
                        and lp.state not in ("Z", "X"):
                    self._kids.setdefault(lp.ppid, []).append(c)
        return list(self._kids.get(pid, ()))

    def workers(self, pid: int, ranks: Collection[int]) -> list[int]:
        """Its children that are no ranks of its job: a rank that started the others (a parent
        holding a GPU itself, multiprocessing with the rank as an argument) waits for them as peers,
        and their work, or their spin in a collective, is not a worker of its own working."""
        return [c for c in self.children(pid) if c not in ranks]

    def workers_work(self, pid: int, ranks: Collection[int], t: float) -> bool:
        """A worker of its own works while its main thread waits on them: a child that is no rank
        of its job, or a thread of its own (a pool's thread computing: the process on the CPU
        while its main thread sleeps)."""
        return self.cpu_works(pid, t) or any(self.cpu_works(c, t) for c in self.workers(pid, ranks))

    def cpu_works(self, pid: int, t: float) -> bool:
        """On the CPU over the window, or runnable most of it on a host short of cores (a starting
        spawn worker importing torch gets 0.1 of a core at load 15)."""
        key = (pid, t)
        out = self._works.get(key)
        if out is None:
            out = self._works[key] = self._cpu_works(pid, t)
        return out

    def _cpu_works(self, pid: int, t: float) -> bool:
        th = self.th
        h = self.procs.get(pid)
        if h is None:
            return False
        # ``proc_window(pid, t, window_s)`` walked without building it: its ends and its R count
        n = running = 0
        newest = oldest = None
        for tt, p in reversed(h.samples):
            if tt > t + 1e-6:
                continue
            if newest is None:
                newest = (tt, p)
            oldest = (tt, p)
            n += 1
            running += p.state == "R"
            if tt < t - th.window_s - 1e-6:
                break
        if n < 2 or newest is None or oldest is None:
            return False
        (t0, a), (t1, b) = oldest, newest
        used = b.cpu_seconds_between(a)
        if used is None or t1 <= t0:
            return False
        cores = used / (t1 - t0)
        return cores >= th.busy_cpu_cores / 2 or (running / n >= th.runnable_fraction and cores >= 2 * th.cpu_active_cores)

    def proc_window(self, pid: int, t: float, window: float) -> list[tuple[float, ProcSample]]:
        h = self.procs.get(pid)
        if h is None:
            return []
        out = []
        for tt, p in reversed(h.samples):
            if tt > t + 1e-6:
                continue
            out.append((tt, p))
            # keep the sample just before the window so a rate spans the whole window
            if tt < t - window - 1e-6:
                break
        out.reverse()
        return out
