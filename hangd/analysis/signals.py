"""What the snapshots say over a short window: per-process and per-GPU signals.

Everything here is computed from snapshots only (no /proc, no NVML), so a live node and a
replayed trace give the same answers. Thresholds are in ``Thresholds`` (thresholds.py) with the
reasoning; the history the signals are read from is ``NodeView`` (nodeview.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hangd.analysis.nodeview import NodeView, ProcHistory
from hangd.analysis.thresholds import Thresholds
from hangd.snapshot import GpuSample, ProcSample


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

    def idle(self, th: Thresholds) -> bool:
        """Read, and no kernel runs: below the active mark, no work and no spin over the window."""
        return self.util is not None and not self.active(th) and self.spin_frac == 0

    def brief(self) -> dict[str, Any]:
        return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in self.__dict__.items() if v is not None}


def pct_text(v: float | None) -> str:
    """A GPM percentage in words: whole numbers from 1% up, two figures below (tensor 0.12%)."""
    v = v or 0.0
    return f"{v:.0f}" if v >= 1 or v == 0 else f"{v:.2g}"


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


def gpu_signals(samples: list[GpuSample], th: Thresholds, marked: list[Marks] | None = None) -> GpuSignals:
    """Means over the window, and which share of the readings show work or a spinning kernel
    (``marked``: the readings' ``reading_marks``, when known)."""
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
    marks = marked or [(g, _reading_works(g, th), _reading_spins(g, th), None) for g in samples]
    s.work_frac = sum(m[1] for m in marks) / len(samples)
    s.spin_frac = sum(m[2] for m in marks) / len(samples)
    return s


Marks = tuple[GpuSample, bool, bool, "int | None"]


def reading_marks(view: NodeView, index: int, readings: list[tuple[float, GpuSample]], th: Thresholds) -> list[Marks]:
    """For each reading of GPU ``index``: whether it shows work, a spin, and the memory it holds
    beyond what the processes NVML lists hold (None: some process's memory is not given). A
    reading is judged once, not at every tick whose window it is in (``NodeView.gpu_marks``)."""
    memo = view.gpu_marks.setdefault(index, {}) if th is view.th else {}
    out = []
    for tt, g in readings:
        m = memo.get(tt)
        if m is None or m[0] is not g:
            m = memo[tt] = (g, _reading_works(g, th), _reading_spins(g, th), _beyond_procs(g))
        out.append(m)
    return out


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
    gpu_shared: bool = False  # another process uses its GPU too
    # its GPU holds memory that no process hangd sees holds (a process of another container, a job
    # of another node's namespace): the GPU's activity may be that one's
    gpu_unseen: bool = False
    gpu_sm_named: bool = False  # NVML's per-process samples gave it SM time in the window
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
    # reads in bursts: seconds since the in counter last moved as fast as its rate over io_window_s
    # (and at least load_read_per_s) between two readings (None: not inside io_window_s), and the
    # longest pause between two such bursts inside io_window_s: a throttled reader's own sleeps
    in_quiet_s: float | None = None
    in_pause_s: float = 0.0
    wakes_per_s: float | None = None  # main-thread voluntary context switches per second over wake_window_s
    asleep_s: float | None = None  # how long its main thread has not woken (None: no counters)
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


def _named_window(view: NodeView, index: int, t: float, th: Thresholds, gw: list[GpuSample]) -> list[GpuSample]:
    """The readings whose per-process samples tell who uses GPU ``index``: NVML names only the
    processes that ran since its previous sample, a few a reading, so with many processes
    time-sliced on one GPU the window may name none of some that use it all along. Back from ``t``
    until the samples name each process on the GPU twice on average: the window at least,
    ``gpu_seen_s`` at most."""
    key = ("named", index, t, id(th))
    hit = view.per_tick.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    need = 2 * max(len(gw[-1].procs), 1) if gw else 0
    out, named = gw, sum(len(g.proc_util or ()) for g in gw)
    # none in the window: NVML gives no per-process data now, and older samples do not stand in
    if 0 < named < need:
        wide = view.gpu_window(index, t, th.gpu_seen_s)
        got, i = 0, len(wide)
        while i > 0 and (got < need or len(wide) - i < len(gw)):
            i -= 1
            got += len(wide[i].proc_util or ())
        out = wide[i:]
    view.per_tick[key] = out
    return out


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


def _unseen(samples: list[GpuSample], base: float, th: Thresholds) -> bool:
    """Whether, in most of at least 3 readings (``unseen_window_s``), the GPU holds memory beyond the driver's (``base``)
    that no process NVML lists holds, a CUDA context's worth at least: a process hangd cannot see
    uses it (NVML lists a container's own processes only, the GPU's memory and utilization are
    everyone's)."""
    # a reading whose processes' memory NVML does not give (MIG without privileges, vGPU) tells nothing
    return _held_unseen([_beyond_procs(g) for g in samples], base, th)


def _beyond_procs(g: GpuSample) -> int | None:
    """The memory a reading shows in use beyond what the processes NVML lists hold (None: some
    process's memory is not given, as under MIG without privileges or a vGPU)."""
    if g.mem_used is None or not all(p.used is not None for p in g.procs):
        return None
    return g.mem_used - sum(p.used for p in g.procs if p.used is not None)


def _held_unseen(extras: list[int | None], base: float, th: Thresholds) -> bool:
    """``_unseen`` over each reading's ``_beyond_procs``."""
    held = [x - base >= th.unseen_gpu_bytes for x in extras if x is not None]
    return len(held) >= 3 and sum(held) > len(held) / 2


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
    """One process's signals at ``t``: its CPU, I/O and memory over the window, its GPU's, its logs'."""
    h = view.procs[pid]
    start = h.first_seen
    latest = h.latest()
    if latest is not None and latest.start_time:
        start = min(start, latest.start_time)
    sig = ProcSignals(pid=pid, age_s=t - start)
    # one walk back through the history for the widest window; the narrower ones are its tails
    wide = view.proc_window(pid, t, max(th.window_s, th.io_window_s, th.wake_window_s))
    if latest is not None:
        sig.state, sig.wchan, sig.rss, sig.threads = latest.state, latest.wchan, latest.rss_bytes, latest.threads
    _window_signals(sig, _tail(wide, t, th.window_s))
    gpus = view.gpu_of.get(pid, {})
    if gpus and t - view.gpu_seen_at.get(pid, -1e9) < th.gpu_seen_s:
        _gpu_signals_of(sig, view, pid, gpus, t, th)
    if h.info:
        _log_signals(sig, view, h, t, th)
    sig.compile_children = view.compile_children.get(pid, 0)
    _long_signals(sig, h, th, t, wide)
    return sig


def _window_signals(sig: ProcSignals, win: list[tuple[float, ProcSample]]) -> None:
    """CPU, I/O rates, memory change and the D and R shares over the window's readings."""
    if len(win) < 2:
        return
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


def _gpu_signals_of(sig: ProcSignals, view: NodeView, pid: int, gpus: dict[int, int | None], t: float,
                    th: Thresholds) -> None:
    """Its GPU's signals (the one it holds most memory on) and its own memory's change there."""
    sig.gpu_indexes = sorted(gpus)
    sig.gpu_mem = sum(v or 0 for v in gpus.values())
    main = max(gpus, key=lambda i: gpus[i] or 0)
    gw, sig.gpu, sig.gpu_work_at, sig.gpu_unseen, sig.gpu_shared = _gpu_window(view, main, t, th)
    sig.gpu_sm_named = any(u.get("pid") == pid and (u.get("sm") or 0) > 0 for g in gw for u in g.proc_util or [])
    if sig.gpu_shared and not _uses_gpu(pid, _named_window(view, main, t, th, gw)):
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


def _log_signals(sig: ProcSignals, view: NodeView, h: ProcHistory, t: float, th: Thresholds) -> None:
    """When a log it writes last grew (its own, or one it shares), and what the log said lately."""
    for target in h.logs():
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


def _gpu_window(view: NodeView, index: int, t: float, th: Thresholds
                ) -> tuple[list[GpuSample], GpuSignals, float | None, bool, bool]:
    """What GPU ``index`` says over the window at ``t``, the same for every process on it: its
    readings, their signals, its last reading of work, whether a process hangd cannot see uses it,
    whether it is shared. Worked out once a snapshot per GPU (``NodeView.per_tick``)."""
    key = ("gpu", index, t, id(th))
    hit = view.per_tick.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    wide = view.gpu_window_t(index, t, max(th.window_s, th.unseen_window_s))
    marks = reading_marks(view, index, wide, th)
    cut = next((i for i, (tt, _) in enumerate(wide) if tt >= t - th.window_s - 1e-6), len(wide))
    gwt, gm = wide[cut:], marks[cut:]
    gw = [g for _, g in gwt]
    work_at = max((tt for (tt, _), m in zip(gwt, gm, strict=True) if m[1]), default=None)
    # GPU readings (and GPM) are per GPU. When several processes share one (a leftover job, MPS,
    # a second job, a process of another container), the per-process SM utilization says whose
    # the activity is: a process NVML sees no SM time for does not own the GPU's work or spin.
    ucut = next((i for i, (tt, _) in enumerate(wide) if tt >= t - th.unseen_window_s - 1e-6), len(wide))
    unseen = _held_unseen([m[3] for m in marks[ucut:]],
                     min(view.gpu_baseline.get(index, th.unattributed_base_bytes), th.unattributed_base_bytes), th)
    out = (gw, gpu_signals(gw, th, gm), work_at, unseen, bool(gw) and (_shared(gw) or unseen))
    view.per_tick[key] = out
    return out


def _tail(wide: list[tuple[float, ProcSample]], t: float, window: float) -> list[tuple[float, ProcSample]]:
    """What ``NodeView.proc_window(pid, t, window)`` returns, cut from a wider window's result:
    the readings inside the window and the one just before it."""
    lim, i = t - window - 1e-6, len(wide) - 1
    while i > 0 and wide[i][0] >= lim:
        i -= 1
    return wide[i:]


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
    # the counters only grow: the same at both ends, they stood still all the window (most ranks,
    # most ticks), and no reading between needs a look
    still = first is last or first == last
    for direction, keys in (("in", ("read_bytes", "rchar")), ("out", ("write_bytes", "wchar"))):
        moved = {k: max(0, last[k] - first[k]) for k in keys if k in first and k in last}
        if not moved:
            continue
        if still:
            setattr(sig, f"{direction}_long_per_s", 0.0)
            setattr(sig, f"{direction}_active_s", 0)
            setattr(sig, f"{direction}_counter", next(iter(moved)))
            if direction == "in":
                sig.in_quiet_s, sig.in_pause_s = None, 0.0
            continue
        key = max(moved, key=lambda k: moved[k])
        secs = set()
        newest = burst_at = None
        pause = 0.0
        # a burst: as fast as the window's own rate, and a loader's (the trickle after a load is not)
        burst_rate = max(th.load_read_per_s, moved[key] / span)
        for (t0, a), (t1, b) in zip(win, win[1:], strict=False):
            if a.io and b.io and key in a.io and key in b.io and b.io[key] - a.io[key] >= th.io_bytes_per_s / 4:
                secs.add(int(t1))
                newest = t1
                if b.io[key] - a.io[key] >= burst_rate * (t1 - t0):
                    if burst_at is not None:
                        pause = max(pause, t0 - burst_at)
                    burst_at = t1
        # bytes that stopped moving a window ago say nothing of now
        if newest is None or win[-1][0] - newest > th.window_s:
            secs = set()
        setattr(sig, f"{direction}_long_per_s", moved[key] / span)
        setattr(sig, f"{direction}_active_s", len(secs))
        setattr(sig, f"{direction}_counter", key)
        if direction == "in":
            sig.in_quiet_s, sig.in_pause_s = (None if burst_at is None else win[-1][0] - burst_at), pause


def _long_signals(sig: ProcSignals, h: ProcHistory, th: Thresholds, t: float,
                  wide: list[tuple[float, ProcSample]]) -> None:
    """Signals over windows longer than the classifier's: sustained I/O, main-thread wake-ups,
    threads that went away. ``wide``: the process's window at least as wide as both."""
    win = _tail(wide, t, th.io_window_s)
    if len(win) >= 2:
        _directions(sig, win, th)
        total = 0
        secs: set[int] = set()
        ends = win[0][1].io, win[-1][1].io
        # counters that only grow, the same at both ends: nothing moved between (see _directions)
        pairs = zip(win, win[1:], strict=False) if not ends[0] or ends[0] != ends[1] else ()
        for (_, a), (t1, b) in pairs:
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
    if h.woke_at is not None:
        sig.asleep_s = t - h.woke_at
    if h.threads_lost is not None:
        sig.threads_lost_at, sig.threads_before, sig.threads_after = h.threads_lost
