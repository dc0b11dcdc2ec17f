"""What the snapshots say over a short window: the node's recent history and per-process signals.

Everything here is computed from snapshots only (no /proc, no NVML), so a live node and a
replayed trace give the same answers. Thresholds are in ``Thresholds`` with the reasoning.
"""

from __future__ import annotations

import re
import tomllib
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from hangd.analysis.hardware import HardwareLog
from hangd.incidents import REFRESH_S, TIMELINE_KEPT
from hangd.snapshot import FileSample, GpuSample, ProcInfo, ProcSample, Snapshot, StackSample

COMPILE_COMMS = re.compile(r"^(ptxas|cc1|cc1plus|nvcc|cicc|gcc|g\+\+|clang|ld|as|ninja|compile_worker|triton)", re.I)
MiB = 1024 * 1024
GiB = 1024 * MiB


@dataclass(frozen=True)
class Thresholds:
    """Where the classifier draws its lines (see docs/operator-guide.md for the reasoning)."""

    window_s: float = 2.0  # rates and GPU readings are averaged over this window
    # GPU work: tensor or DRAM activity (GPM %), or NVLink traffic. A spinning NCCL kernel shows
    # 100% util at ~18% SM, 0% tensor, 0% DRAM, no NVLink (FIELD-NOTES).
    # Light work counts too: token-by-token generation of a small tensor-parallel model shows SM
    # 2-7%, tensor 0.1-0.3%, DRAM ~2% and NVLink 65-290 MB/s, where a spinning kernel shows 0 and 0.
    gpu_tensor_pct: float = 3.0
    gpu_dram_pct: float = 1.0
    gpu_nvlink_mibs: float = 20.0
    gpu_util_mem_pct: float = 3.0  # fallback without GPM: memory-controller activity
    spin_util_pct: float = 90.0
    spin_sm_max_pct: float = 40.0
    gpu_active_util_pct: float = 10.0
    # host-side progress
    io_bytes_per_s: float = 1 * MiB
    io_window_s: float = 6.0  # disk I/O is judged over this longer window: a slow reader reads in bursts
    io_sustained_s: int = 2  # ... and counts as progress when it moved in this many distinct seconds of it
    io_sustain_s: float = 3.0  # read/write syscalls must go on this long to count (a dump being written is shorter)
    wake_window_s: float = 3.0  # main-thread wake-ups are counted over this window
    wake_per_s: float = 3.0  # a rank blocked in a collective whose main thread wakes this often: they complete
    # GPU kernels running (util above gpu_active_util_pct) while the main thread wakes this often: it
    # drives the GPU (DDP over NCCL's socket transport on one H200: util 20-47%, SM 0-1%, ~350 wakes/s)
    driving_wakes_per_s: float = 100.0
    load_read_per_s: float = 20 * MiB
    # bytes moving one way over io_window_s, whichever counter: a throttled page-cache reader (8 MB,
    # then 60 ms asleep) reads ~130 MB/s on rchar alone; a checkpoint writer 78 MB/s (FIELD-NOTES)
    # (imports read less: transformers' read 10-15 MB/s on rchar for ~10 s, on H200 hosts)
    moving_bytes_per_s: float = 40 * MiB
    moving_ratio: float = 4.0  # ... at least this many times more than the other way
    load_rchar_per_s: float = 200 * MiB
    socket_char_per_s: float = 256 * 1024
    rss_change_bytes: float = 256 * MiB
    gpu_mem_change_bytes: float = 64 * MiB
    capture_growth_per_s: float = 200 * MiB  # sustained over two windows; allocator warm-up is shorter
    busy_cpu_cores: float = 0.5
    # a main thread runnable (state R) in this share of the window's readings wants the CPU and
    # works, whatever it gets: on a host short of cores (2 cores at load 15) a training step gets
    # 0.15 of one
    runnable_fraction: float = 0.6
    cpu_active_cores: float = 0.02  # below this a process does nothing on the CPU
    compile_cpu_cores: float = 0.3  # ... with compiler processes under it: compiling
    compile_worker_cores: float = 0.1  # a compile worker counts while it uses this much
    filling_d_fraction: float = 0.25  # share of readings in disk wait that says data is being loaded
    io_wait_d_fraction: float = 0.5  # ... that says it is stuck in I/O when nothing moves
    saturated_util_pct: float = 98.0  # a saturated GPU (util and SM): work, not graph capture
    saturated_sm_pct: float = 75.0
    gpu_seen_s: float = 10.0  # a process's GPU memory counts while NVML listed it this recently
    # decisions
    progress_recent_s: float = 5.0  # a rank progressed "recently" within this
    hang_gpu_s: float = 10.0  # no progress while a rank spins in a GPU collective
    hang_host_s: float = 12.0  # no progress while stacks show ranks blocked host-side
    hang_io_s: float = 30.0  # uninterruptible sleep with no I/O
    # a rank stopped by a signal (state T) runs no code until someone continues it: nothing moving
    # this long with one stopped is a hang (a debugger's stop is state t, not T)
    hang_stopped_s: float = 4.0
    startup_max_s: float = 600.0  # a process is "starting" at most this long
    startup_cpu_s: float = 20.0  # CPU work without a GPU counts as setup (imports) this long
    # work on the CPU or moving bytes, once its CUDA context exists, that lasts this long ends its
    # setup (a blip finishing CUDA's own init does not)
    startup_work_s: float = 2.0
    startup_imports_s: float = 8.0  # without a CUDA context, reading this young is importing (torch: 3-5 s)
    startup_quiet_s: float = 10.0  # a process asleep this long after its setup is idle, not starting
    startup_quiet_cpu_cores: float = 0.05  # ... "asleep": below this much CPU
    started_gpu_mem_bytes: float = 1.5 * GiB  # more than a CUDA context: the job has set up
    dwell_s: float = 2.0  # a new state must hold this long before it is reported
    # ... and "idle" longer: a rank that just went quiet is idle, or stuck in a wait its stack (taken
    # after stack_quiet_s) will show; say which once the stack is in
    idle_dwell_s: float = 5.0
    stack_quiet_s: float = 3.0  # capture stacks of a job quiet this long
    stack_repeat_s: float = 5.0  # ... and again this much later, to show it is stuck
    straggler_wait_s: float = 10.0  # seconds peers waited on one rank within straggler_window_s
    straggler_window_s: float = 60.0
    rank_exit_grace_s: float = 10.0
    orphan_gpu_s: float = 5.0
    unattributed_gpu_bytes: float = 2 * GiB
    unattributed_gpu_s: float = 30.0
    unattributed_base_bytes: float = 1 * GiB  # GPU memory in use with no process: up to this is the driver's
    verdict_fresh_s: float = 60.0  # a stack verdict describes its process at most this long
    verdict_known_s: float = 300.0  # the last known kind of wait, for telling a cycling wait from a stuck one
    stack_recapture_s: float = 300.0  # a quiet job's stacks are taken again this often
    cpu_stack_every_s: float = 30.0  # ... and a rank's on the CPU with no GPU work and no fresh stack (what it does)
    fr_rerequest_s: float = 60.0  # flight-recorder dumps of a hung job are asked for again this often
    log_recent_s: float = 3.0  # a phase named by a log line holds this long
    exception_lookback_s: float = 300.0  # an exception in a log this long before a hang may be its cause
    straggler_quiet_after_s: float = 60.0  # a straggler incident resolves after this long without waits
    serve_job_quiet_s: float = 60.0  # history of a job kept this long after its last process went
    # a process that exited stays listed (state "gone") this long, then the analysis forgets it
    # (the setting of the same name)
    gone_after_s: float = 120.0
    max_incidents_in_memory: int = 500  # resolved incidents kept in memory (the store keeps all)
    max_findings_in_memory: int = 500
    # a job that spans nodes: another node whose hangd last reported longer ago than this has
    # stopped reporting; its ranks are named as unknown, never blamed. Heartbeats come every 2 s
    # (heartbeat_s): 15 s is seven missed in a row (chosen, not measured). The one default: the
    # setting, the store and the job views take it from here.
    node_stale_s: float = 15.0
    max_changes_in_memory: int = 2000
    # incidents: an open incident's ticking figures ("has waited 41 s") change every tick and
    # reach the store and watchers this often, not on every tick (what a person reads changing
    # goes out at once); an incident's timeline keeps its first entry and this many newest
    # (chosen, not measured)
    incident_refresh_s: float = REFRESH_S
    timeline_kept: int = TIMELINE_KEPT
    # stragglers: a wait is a pattern when at least this many earlier waits of the same ranks fell in
    # straggler_window_s (one earlier blip is not one), and is blamed only while the waiting ranks
    # progressed in at least this many distinct seconds since the first wait (they do get through;
    # the recorded straggler traces, tests/data/traces, show it every step)
    straggler_recurring: int = 2
    straggler_progressed_secs: int = 3
    # memory: readings kept per process, 120: the widest window (io_window_s) at 4 readings a second
    # with room to spare; what needs older readings is remembered instead (600 readings of every
    # watched process were most of a long-running daemon's memory). GPU readings per GPU: 1200.
    history_readings: int = 120
    gpu_history_readings: int = 1200
    # bounds on what is kept, chosen, not measured: stack captures per process (a stack that stands
    # still between two captures is the evidence), exception lines per log, log lines an incident quotes
    stacks_kept: int = 6
    exceptions_kept: int = 8
    log_lines_quoted: int = 20
    # process trees: how far up a process's ancestors are walked for its launcher and its rank, and
    # for the rank a compile worker (ptxas, cc1, inductor's workers) works for; torchrun puts its
    # ranks directly under it, so 4 leaves room for a wrapper script or two (chosen, not measured)
    ancestor_depth: int = 4
    compile_worker_depth: int = 4


@lru_cache(maxsize=1)
def log_catalog() -> dict[str, re.Pattern[str]]:
    data = tomllib.loads(resources.files("hangd.analysis").joinpath("catalog.toml").read_text())
    out = {}
    for kind, pats in (data.get("log") or {}).items():
        out[kind] = re.compile("|".join(f"(?:{p if p.startswith('^') else re.escape(p)})" for p in pats), re.M)
    return out


def classify_log_lines(text: str) -> tuple[int, set[str]]:
    """(bytes of lines that are not diagnostic, phase kinds the lines name)."""
    cat = log_catalog()
    diag = cat.get("diagnostic")
    useful = 0
    kinds: set[str] = set()
    for line in text.splitlines():
        if not line.strip():
            continue
        if diag is not None and diag.search(line):
            continue
        useful += len(line) + 1
        for kind, pat in cat.items():
            if pat.search(line):  # not "diagnostic": such lines were passed over above
                kinds.add(kind)
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

    def latest(self) -> ProcSample | None:
        return self.samples[-1][1] if self.samples else None


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

    def feed(self, snap: Snapshot) -> None:
        t = snap.t
        self.t = max(self.t, t)
        self.new_stacks = []
        if snap.gpus:
            self.gpu_of = {}
            self.hw.feed(snap)
        for g in snap.gpus:
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
        for info in snap.infos:
            h = self._proc(info.pid, t)
            h.info = info
            if h.first_ppid is None:
                h.first_ppid = info.ppid
        for p in snap.procs:
            if p.gone:
                gone = self.procs.get(p.pid)
                if gone is not None:  # a process never seen (or long forgotten) leaves no history
                    gone.gone_at = gone.gone_at or t
                continue
            h = self._proc(p.pid, t)
            h.gone_at = None
            if h.first_ppid is None:
                h.first_ppid = p.ppid
            last = h.latest()
            if last is not None and last.threads is not None and p.threads is not None and p.threads < last.threads:
                h.threads_lost = (t, last.threads, p.threads)
            h.samples.append((t, p))
            if p.state == "Z":
                h.zombie_since = h.zombie_since or t
            else:
                h.zombie_since = None
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
        self._trim(t)

    def _count_writers(self) -> None:
        self.writers = {}
        for h in self.procs.values():
            if h.gone_at is None and h.info is not None:
                for target in h.info.log_files():
                    self.writers[target] = self.writers.get(target, 0) + 1

    def _count_compile_workers(self) -> None:
        """Compiler processes (ptxas, cc1, inductor compile workers) counted for each ancestor."""
        self.compile_children = {}
        for h in self.procs.values():
            lp = h.latest()
            if lp is None or h.gone_at is not None:
                continue
            cmd = " ".join(h.info.cmdline or []) if h.info else ""
            if not ((lp.comm and COMPILE_COMMS.search(lp.comm)) or "compile_worker" in cmd or "_inductor" in cmd):
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
                if start > 0 and nl < 0:  # the line began before the tail we have: drop the fragment
                    new = new.partition("\n")[2]
                # an unfinished last line is judged when it is complete
                new = new[: new.rfind("\n") + 1]
            useful, kinds = classify_log_lines(new) if f.tail is not None else (f.size - st.size, set())
            if useful > 0:
                st.grew_at = t
            for k in kinds:
                st.kinds_at[k] = t
            for line in exception_lines(new):
                st.exceptions.append((t, line))
        elif st.size is None and f.tail:
            for line in exception_lines(f.tail)[-3:]:
                st.exceptions.append((None, line))
        if f.tail is not None:
            st.tail = f.tail
        st.size = f.size

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
        written = {target for h in self.procs.values() if h.info is not None for target in h.info.log_files()}
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


@dataclass
class GpuSignals:
    util: float | None = None
    util_mem: float | None = None
    sm: float | None = None
    tensor: float | None = None
    dram: float | None = None
    nvlink_mibs: float | None = None
    power_w: float | None = None
    has_gpm: bool = False
    work_frac: float = 0.0  # share of the window's readings with real work
    spin_frac: float = 0.0  # share of the window's readings with a kernel spinning

    def works(self, th: Thresholds) -> bool:
        """Most readings of the window show real work (not only a resident kernel)."""
        return self.work_frac >= 0.5

    def any_work(self) -> bool:
        """Some reading of the window shows real work: a straggler's victim works in bursts."""
        return self.work_frac > 0

    def spins(self, th: Thresholds) -> bool:
        """Most readings show a kernel resident but doing nothing: a collective waiting for a peer."""
        return self.spin_frac >= 0.5

    def active(self, th: Thresholds) -> bool:
        return (self.util or 0) >= th.gpu_active_util_pct or self.works(th)

    def brief(self) -> dict[str, Any]:
        return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in self.__dict__.items() if v is not None}


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def _reading_works(g: GpuSample, th: Thresholds) -> bool:
    if g.gpm:
        nv = g.gpm.get("NVLINK_TOTAL_TX_PER_SEC", 0.0) + g.gpm.get("NVLINK_TOTAL_RX_PER_SEC", 0.0)
        return (g.gpm.get("ANY_TENSOR_UTIL", 0.0) >= th.gpu_tensor_pct or g.gpm.get("DRAM_BW_UTIL", 0.0) >= th.gpu_dram_pct
                or nv >= th.gpu_nvlink_mibs)
    return (g.util_mem or 0) >= th.gpu_util_mem_pct


def _reading_spins(g: GpuSample, th: Thresholds) -> bool:
    if (g.util_gpu or 0) < th.spin_util_pct or _reading_works(g, th):
        return False
    return g.gpm.get("SM_UTIL", 0.0) < th.spin_sm_max_pct if g.gpm else True


def gpu_signals(samples: list[GpuSample], th: Thresholds) -> GpuSignals:
    """Means over the window, and which share of the readings show work or a spinning kernel."""
    s = GpuSignals()
    if not samples:
        return s
    s.util = _mean([g.util_gpu for g in samples if g.util_gpu is not None])
    s.util_mem = _mean([g.util_mem for g in samples if g.util_mem is not None])
    s.power_w = _mean([w for g in samples if (w := g.power_w) is not None])
    gpm = [g.gpm for g in samples if g.gpm]
    if gpm:
        s.has_gpm = True
        s.sm = _mean([x.get("SM_UTIL", 0.0) for x in gpm])
        s.tensor = _mean([x.get("ANY_TENSOR_UTIL", 0.0) for x in gpm])
        s.dram = _mean([x.get("DRAM_BW_UTIL", 0.0) for x in gpm])
        s.nvlink_mibs = _mean([x.get("NVLINK_TOTAL_TX_PER_SEC", 0.0) + x.get("NVLINK_TOTAL_RX_PER_SEC", 0.0) for x in gpm])
    s.work_frac = sum(_reading_works(g, th) for g in samples) / len(samples)
    s.spin_frac = sum(_reading_spins(g, th) for g in samples) / len(samples)
    return s


@dataclass
class ProcSignals:
    """One process over the window. Rates per second; None where unknown."""

    pid: int
    age_s: float
    state: str | None = None
    wchan: str | None = None
    cpu_cores: float | None = None
    read_per_s: float | None = None
    write_per_s: float | None = None
    rchar_per_s: float | None = None
    wchar_per_s: float | None = None
    rss_change: int | None = None
    rss: int | None = None
    threads: int | None = None
    d_fraction: float = 0.0
    r_fraction: float = 0.0  # share of the window's readings with the main thread runnable (state R)
    gpu_mem: int = 0
    gpu_mem_change: int = 0
    gpu_mem_rate: float = 0.0
    gpu_mem_rate_before: float = 0.0
    gpu_indexes: list[int] = field(default_factory=list)
    gpu: GpuSignals = field(default_factory=GpuSignals)
    gpu_work_at: float | None = None  # time of the newest reading with real work
    gpu_shared_idle: bool = False  # it shares its GPU and NVML shows it using none of it
    log_grew_at: float | None = None  # newest growth of a log that this process wrote itself
    log_grew_shared_at: float | None = None  # newest growth of a log it shares, written by others
    log_kinds: set[str] = field(default_factory=set)
    log_phase: tuple[str, float] | None = None  # the newest phase its own log named, and when
    compile_children: int = 0
    io_long_per_s: float | None = None  # read + write bytes per second over io_window_s
    io_active_s: int = 0  # distinct seconds of io_window_s in which it read or wrote
    io_last_at: float | None = None  # end of the newest interval in which it read or wrote
    # bytes moved over io_window_s by direction, whichever counter moved most (read_bytes/rchar,
    # write_bytes/wchar): page-cache reads raise rchar only, a disk read raises both
    in_long_per_s: float | None = None
    out_long_per_s: float | None = None
    in_active_s: int = 0  # distinct seconds of io_window_s in which it read
    out_active_s: int = 0
    in_counter: str = ""  # the counter that moved most ("rchar", "read_bytes")
    out_counter: str = ""
    wakes_per_s: float | None = None  # main-thread voluntary context switches per second over wake_window_s
    threads_lost_at: float | None = None  # when its thread count last fell
    threads_before: int | None = None
    threads_after: int | None = None

    def brief(self) -> dict[str, Any]:
        d: dict[str, Any] = {"state": self.state, "wchan": self.wchan}
        for k in ("cpu_cores", "read_per_s", "write_per_s", "rchar_per_s"):
            v = getattr(self, k)
            if v is not None:
                d[k] = round(v, 2) if k == "cpu_cores" else int(v)
        d["gpu_mem_bytes"] = self.gpu_mem
        if self.gpu_mem_change:
            d["gpu_mem_change_bytes"] = self.gpu_mem_change
        if self.gpu_indexes:
            d["gpus"] = self.gpu_indexes
            d["gpu"] = self.gpu.brief()
        return d




def _uses_gpu(pid: int, samples: list[GpuSample]) -> bool:
    """Whether NVML's per-process utilization shows SM time for ``pid`` on this GPU in the window
    (True when NVML gives no per-process data: then nothing can be told apart)."""
    seen = False
    for g in samples:
        for u in g.proc_util or []:
            seen = True
            if u.get("pid") == pid and (u.get("sm") or 0) > 0:
                return True
    return not seen


def _shared(samples: list[GpuSample]) -> bool:
    """Whether another process uses this GPU: NVML lists several on it, or its per-process
    utilization gives SM time to a pid it never listed on it in the window. A hangd in a PID
    namespace of its own (a container without hostPID, a node of the fleet checks) is listed only
    its namespace's processes, with their pids in it, but is given every process's samples, those
    of processes outside under their host pids (seen on an H200)."""
    if len(samples[-1].procs) > 1:
        return True
    listed = {p.pid for g in samples for p in g.procs}
    return any(u.get("pid") not in listed and (u.get("sm") or 0) > 0 for g in samples for u in g.proc_util or [])


def _used_by(pid: int, samples: list[GpuSample]) -> list[int]:
    """GPU memory ``pid`` held in each sample that reports it."""
    out = []
    for g in samples:
        for p in g.procs:
            if p.pid == pid and p.used is not None:
                out.append(p.used)
                break
    return out


def proc_signals(view: NodeView, pid: int, t: float, th: Thresholds) -> ProcSignals:
    h = view.procs[pid]
    start = h.first_seen
    latest = h.latest()
    if latest is not None and latest.start_time:
        start = min(start, latest.start_time)
    sig = ProcSignals(pid=pid, age_s=t - start)
    # one walk back through the history for the widest window; the narrower ones are its tails
    wide = view.proc_window(pid, t, max(th.window_s, th.io_window_s, th.wake_window_s))
    win = _tail(wide, t, th.window_s)
    if latest is not None:
        sig.state, sig.wchan, sig.rss, sig.threads = latest.state, latest.wchan, latest.rss_bytes, latest.threads
    if len(win) >= 2:
        (t0, a), (t1, b) = win[0], win[-1]
        dt = max(t1 - t0, 1e-3)
        cpu_s = b.cpu_seconds_between(a)
        if cpu_s is not None:
            sig.cpu_cores = cpu_s / dt
        if a.io and b.io:
            for key, attr in (("read_bytes", "read_per_s"), ("write_bytes", "write_per_s"),
                              ("rchar", "rchar_per_s"), ("wchar", "wchar_per_s")):
                if key in a.io and key in b.io:
                    setattr(sig, attr, max(0, b.io[key] - a.io[key]) / dt)
        if a.rss_bytes is not None and b.rss_bytes is not None:
            sig.rss_change = b.rss_bytes - a.rss_bytes
        ds = [p.state == "D" or (p.thread_states or {}).get("D", 0) > 0 for _, p in win[1:]]
        sig.d_fraction = sum(ds) / len(ds) if ds else 0.0
        rs = [p.state == "R" for _, p in win]
        sig.r_fraction = sum(rs) / len(rs)
    gpus = view.gpu_of.get(pid, {})
    if gpus and t - view.gpu_seen_at.get(pid, -1e9) < th.gpu_seen_s:
        sig.gpu_indexes = sorted(gpus)
        sig.gpu_mem = sum(v or 0 for v in gpus.values())
        main = max(gpus, key=lambda i: gpus[i] or 0)
        gwt = view.gpu_window_t(main, t, th.window_s)
        gw = [g for _, g in gwt]
        sig.gpu = gpu_signals(gw, th)
        sig.gpu_work_at = max((tt for tt, g in gwt if _reading_works(g, th)), default=None)
        # GPU readings (and GPM) are per GPU. When several processes share one (a leftover job, MPS,
        # a second job, a process of another container), the per-process SM utilization says whose
        # the activity is: a process NVML sees no SM time for does not own the GPU's work or spin.
        if gw and _shared(gw) and not _uses_gpu(pid, gw):
            sig.gpu = GpuSignals(util=0.0, has_gpm=sig.gpu.has_gpm, power_w=sig.gpu.power_w)
            sig.gpu_work_at = None
            sig.gpu_shared_idle = True
        used = _used_by(pid, gw)
        prev = _used_by(pid, view.gpu_window(main, t - th.window_s, 1.0))
        if used and prev:
            sig.gpu_mem_change = used[-1] - prev[-1]
            sig.gpu_mem_rate = sig.gpu_mem_change / th.window_s
            # the window before: growth that lasts two windows is sustained
            pb = _used_by(pid, view.gpu_window(main, t - 2 * th.window_s, 1.0))
            if pb:
                sig.gpu_mem_rate_before = (prev[-1] - pb[-1]) / th.window_s
        elif len(used) >= 2:
            sig.gpu_mem_change = used[-1] - used[0]
            sig.gpu_mem_rate = sig.gpu_mem_change / th.window_s
    if h.info:
        for target in h.info.log_files():
            fs = view.files.get(target)
            if fs is None or fs.grew_at is None:
                continue
            # A log grew: this process's progress only if it wrote it. Its write counter (wchar)
            # must have moved over the same interval; a log several processes share (torchrun's
            # combined stdout, nohup.out) may have grown because someone else wrote.
            mine = _wrote_around(h, fs.grew_at, 2 * th.window_s)
            if mine is None:  # no I/O counters: a log it alone writes is its own
                mine = view.writers.get(target, 0) <= 1
            if mine:
                if sig.log_grew_at is None or fs.grew_at > sig.log_grew_at:
                    sig.log_grew_at = fs.grew_at
                sig.log_kinds |= {k for k, at in fs.kinds_at.items() if t - at <= th.log_recent_s}
                for k, at in fs.kinds_at.items():
                    if sig.log_phase is None or at > sig.log_phase[1]:
                        sig.log_phase = (k, at)
            elif sig.log_grew_shared_at is None or fs.grew_at > sig.log_grew_shared_at:
                sig.log_grew_shared_at = fs.grew_at
    sig.compile_children = view.compile_children.get(pid, 0)
    _long_signals(sig, h, th, t, wide)
    return sig


def _tail(wide: list[tuple[float, ProcSample]], t: float, window: float) -> list[tuple[float, ProcSample]]:
    """What ``NodeView.proc_window(pid, t, window)`` returns, cut from a wider window's result."""
    out = []
    for tt, p in reversed(wide):
        out.append((tt, p))
        if tt < t - window - 1e-6:
            break
    out.reverse()
    return out


def _wrote_around(h: ProcHistory, at: float, within: float) -> bool | None:
    """Whether the process's wchar grew in the ``within`` seconds up to ``at`` (None: unknown).
    A little slack: the log's size and the process's counters are read at slightly different
    moments, and a recorder may have reused a quiet process's counters for a few ticks.
    Only readings up to ``at`` count, and they are all in when it is first asked (a log's growth
    is seen after the readings of the same moment), so the answer is kept: it stays the same
    after those readings have left the history."""
    key = (at, within)
    if key in h.wrote:
        h.wrote[key] = out = h.wrote.pop(key)  # the newest asked for stays
        return out
    out = h.wrote[key] = _wrote_in(h, at, within)
    if len(h.wrote) > 16:
        del h.wrote[next(iter(h.wrote))]  # the growth least recently asked about
    return out


def _wrote_in(h: ProcHistory, at: float, within: float) -> bool | None:
    newest: int | None = None
    for tt, p in reversed(h.samples):
        if tt > at + 1e-6:
            continue
        w = (p.io or {}).get("wchar")
        if w is None:
            return None if newest is None else False
        if newest is None:
            newest = w
        elif w < newest:
            return True
        if tt < at - within:
            break
    return None if newest is None else False


def _directions(sig: ProcSignals, win: list[tuple[float, ProcSample]], th: Thresholds) -> None:
    """Bytes in and out over the window, each direction by the counter that moved most."""
    first, last = win[0][1].io, win[-1][1].io
    if not first or not last:
        return
    span = max(win[-1][0] - win[0][0], 1e-3)
    for direction, keys in (("in", ("read_bytes", "rchar")), ("out", ("write_bytes", "wchar"))):
        moved = {k: max(0, last[k] - first[k]) for k in keys if k in first and k in last}
        if not moved:
            continue
        key = max(moved, key=lambda k: moved[k])
        secs = set()
        newest = None
        for (_, a), (t1, b) in zip(win, win[1:], strict=False):
            if a.io and b.io and key in a.io and key in b.io and b.io[key] - a.io[key] >= th.io_bytes_per_s / 4:
                secs.add(int(t1))
                newest = t1
        # bytes that stopped moving a window ago say nothing of now
        if newest is None or win[-1][0] - newest > th.window_s:
            secs = set()
        setattr(sig, f"{direction}_long_per_s", moved[key] / span)
        setattr(sig, f"{direction}_active_s", len(secs))
        setattr(sig, f"{direction}_counter", key)


def _long_signals(sig: ProcSignals, h: ProcHistory, th: Thresholds, t: float,
                  wide: list[tuple[float, ProcSample]]) -> None:
    """Signals over windows longer than the classifier's: sustained I/O, main-thread wake-ups,
    threads that went away. ``wide``: the process's window at least as wide as both."""
    win = _tail(wide, t, th.io_window_s)
    if len(win) >= 2:
        _directions(sig, win, th)
        total = 0
        secs: set[int] = set()
        for (_, a), (t1, b) in zip(win, win[1:], strict=False):
            ai, bi = a.io, b.io
            if ai and bi:
                # the source hands on the same dict while the counters stand still: nothing moved
                d = 0 if ai is bi else (max(0, bi.get("read_bytes", 0) - ai.get("read_bytes", 0))
                                        + max(0, bi.get("write_bytes", 0) - ai.get("write_bytes", 0)))
                total += d
                if d >= th.io_bytes_per_s / 4:
                    secs.add(int(t1))
                    sig.io_last_at = t1
        span = max(win[-1][0] - win[0][0], 1e-3)
        if win[0][1].io and win[-1][1].io:
            sig.io_long_per_s = total / span
        sig.io_active_s = len(secs)
    wwin = _tail(wide, t, th.wake_window_s)
    vals = [(tt, p.voluntary_ctxt_switches) for tt, p in wwin if p.voluntary_ctxt_switches is not None]
    if len(vals) >= 2 and vals[-1][0] - vals[0][0] >= th.wake_window_s / 2:
        sig.wakes_per_s = max(0, vals[-1][1] - vals[0][1]) / (vals[-1][0] - vals[0][0])
    if h.threads_lost is not None:
        sig.threads_lost_at, sig.threads_before, sig.threads_after = h.threads_lost
