"""Progress: which signal moved, and whose it is.

A job is hung only when none of its ranks progresses, so everything rests on crediting progress
to the right process. Progress is real work on the GPU, GPU or host memory changing, sustained disk
I/O, a log the process itself wrote growing, its flight-recorder sequence numbers advancing, its
stack changing between captures, and its collectives completing (a rank blocked in a collective
whose main thread keeps waking up). It is not CPU time (a rank spinning in a collective burns a
core), nor a shared log that someone else wrote, nor a short burst of I/O (a dump being written).

"Strong" progress ends a hang; "weak" progress (data moving through read/write calls, host
memory changing, collectives completing with no work) only keeps one from being declared.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hangd.analysis.facts import io as io_facts
from hangd.analysis.signals import ProcSignals, pct_text
from hangd.analysis.thresholds import GiB, Thresholds

# A rank blocked in a collective whose main thread keeps waking: its collectives complete. Not the
# rendezvous store: its client polls with short timeouts and wakes while it waits (seen on H200s).
COLLECTIVE_WAITS = ("collective",)


@dataclass
class Progress:
    """What one process last did that counts as progress."""

    last: float | None = None  # any progress
    last_strong: float | None = None
    why: str = ""
    strong_secs: deque[int] = field(default_factory=lambda: deque(maxlen=300))  # seconds with strong progress of work
    io_since: float | None = None
    chars_since: float | None = None
    # when its flight recorder last showed its collectives completing, and how many a second (None
    # once a newer dump shows none more); and its last strong progress that was work, not them
    collectives_at: float | None = None
    collectives_per_s: float | None = None
    collectives_seen_at: float | None = None  # when the dump that showed them came
    last_work: float | None = None

    def recent(self, t: float, within: float) -> bool:
        return self.last_strong is not None and t - self.last_strong <= within


class ProgressBook:
    """Progress per pid; ``credit`` is the one way in."""

    def __init__(self, th: Thresholds) -> None:
        self.th = th
        self.by_pid: dict[int, Progress] = {}

    def of(self, pid: int) -> Progress:
        p = self.by_pid.get(pid)
        if p is None:
            p = self.by_pid[pid] = Progress()
        return p

    def forget(self, pid: int) -> None:
        self.by_pid.pop(pid, None)

    def credit(self, pid: int, t: float, why: str, strong: bool, collectives_per_s: float | None = None,
               seen_at: float | None = None) -> None:
        """Progress at ``t``; ``collectives_per_s`` where what moved is its collectives completing
        (at that rate), not work of its own, as a dump that came at ``seen_at`` showed them."""
        p = self.of(pid)
        if p.last is None or t >= p.last:
            p.last, p.why = t, why
        if strong and (p.last_strong is None or t >= p.last_strong):
            p.last_strong = t
        if collectives_per_s is not None:
            if p.collectives_at is None or t >= p.collectives_at:
                p.collectives_at, p.collectives_per_s, p.collectives_seen_at = t, collectives_per_s, seen_at
        elif strong and (p.last_work is None or t >= p.last_work):
            p.last_work = t
        if strong and collectives_per_s is None and (not p.strong_secs or int(t) > p.strong_secs[-1]):
            p.strong_secs.append(int(t))  # seconds it worked: a straggler's peers still progress

    def observe(self, pid: int, s: ProcSignals, t: float, last_wait: str | None) -> None:
        """Credit what moved in this process's signals at ``t``. ``last_wait`` is the kind of wait
        its last stack showed (``collective``, ``store``, ...) while it stayed blocked there."""
        th = self.th
        p = self.of(pid)
        if s.state == "Z":
            return
        g = s.gpu
        if g.any_work() and s.gpu_work_at is not None:
            self.credit(pid, s.gpu_work_at, f"GPU {s.gpu_indexes[0]} working (tensor {pct_text(g.tensor)}%, DRAM "
                        f"{pct_text(g.dram)}%, NVLink {g.nvlink_mibs or 0:.0f} MiB/s)" if g.has_gpm else
                        f"GPU {s.gpu_indexes[0]} memory controller {g.util_mem or 0:.0f}% busy", strong=True)
        if abs(s.gpu_mem_change) >= th.gpu_mem_change_bytes:
            self.credit(pid, t, f"GPU memory changed by {s.gpu_mem_change / GiB:+.2f} GiB", strong=True)
        # a rank whose main thread stays blocked (a collective, the store, an event) is not moving data for
        # the job: a side thread is (a flight-recorder dump importing modules and writing its file)
        blocked = last_wait in ("collective", "store", "lock_wait")
        if not blocked:
            self._observe_io(pid, p, s, t)
        else:
            p.io_since = None
        if s.log_grew_at is not None and t - s.log_grew_at <= th.window_s:
            self.credit(pid, s.log_grew_at, "it wrote to its log", strong=True)
        if not s.gpu_indexes and not blocked and (s.rchar_per_s or 0) + (s.wchar_per_s or 0) >= th.socket_char_per_s and \
                (s.cpu_cores or 0) >= th.cpu_active_cores:
            # read/write syscalls also count file reads (imports, a dump being written): only data
            # moving for a while, as a CPU job's collectives do step after step, is progress
            if p.chars_since is None:
                p.chars_since = t
            if t - p.chars_since >= th.io_sustain_s:
                self.credit(pid, t, "it moves data (read/write syscalls)", strong=False)
        else:
            p.chars_since = None
        if io_facts.socket_transport(s, th):
            # ranks sharing a GPU talk over NCCL's sockets: their collectives' bytes moving while
            # the kernels spin between the chunks keep a hang from being declared (rankstate.classify
            # reads such a rank busy); once the bytes stop, the spin is a wait like any other
            self.credit(pid, t, "its collectives move data through its sockets", strong=False)
        if s.rss_change is not None and abs(s.rss_change) >= th.rss_change_bytes and not blocked:
            self.credit(pid, t, f"host memory changed by {s.rss_change / GiB:+.2f} GiB", strong=False)
        if last_wait in COLLECTIVE_WAITS and (s.wakes_per_s or 0) >= th.wake_per_s:
            # blocked in a collective, yet its main thread keeps waking: the collectives complete
            self.credit(pid, t, f"its collectives keep completing (main thread woke {s.wakes_per_s:.0f} times a second)",
                        strong=False)

    def _observe_io(self, pid: int, p: Progress, s: ProcSignals, t: float) -> None:
        """Credit bytes it moved through disk or any I/O counter (its main thread not blocked)."""
        th = self.th
        io = (s.read_per_s or 0) + (s.write_per_s or 0)
        if io >= th.io_bytes_per_s:
            if p.io_since is None:
                p.io_since = t
            # a short burst (a dump being written) is not progress of a hung job; sustained I/O is;
            # credited when the bytes last moved (the rate is over the window before t)
            at = t if s.io_last_at is None else min(t, s.io_last_at)
            self.credit(pid, at, f"disk I/O {io / 1e6:.0f} MB/s", strong=t - p.io_since >= th.io_sustain_s)
        else:
            p.io_since = None
        if (s.io_long_per_s or 0) >= th.io_bytes_per_s and s.io_active_s >= th.io_sustained_s \
                and s.io_last_at is not None:
            # a slow reader reads in bursts with sleeps between: bytes read over a longer window,
            # credited when they were last read
            self.credit(pid, s.io_last_at, f"disk I/O {s.io_long_per_s / 1e6:.0f} MB/s over the last "  # type: ignore[operator]
                        f"{th.io_window_s:.0f} s", strong=True)
        # bytes moving one way, whichever counter moves: a loader reading from the page cache
        # raises rchar alone, a checkpoint writer wchar and write_bytes
        for direction, verb in (("in", "read"), ("out", "wrote")):
            if io_facts.moves(s, th, direction):
                rate = s.in_long_per_s if direction == "in" else s.out_long_per_s
                counter = s.in_counter if direction == "in" else s.out_counter
                # reads are credited when bytes last came in at a loader's rate, not at every tick
                # of the window after them
                at = t - s.in_quiet_s if direction == "in" and s.in_quiet_s is not None else t
                self.credit(pid, at, f"it {verb} {(rate or 0) / 1e6:.0f} MB/s over the last {th.io_window_s:.0f} s "
                            f"({counter})", strong=True)

    def job_last(self, pids: list[int]) -> tuple[float | None, float | None]:
        """(last progress of any kind, last strong progress) over ``pids``."""
        lasts = [x for p in pids if (x := self.of(p).last) is not None]
        strong = [x for p in pids if (x := self.of(p).last_strong) is not None]
        return (max(lasts) if lasts else None), (max(strong) if strong else None)

    def job_last_work(self, pids: list[int]) -> float | None:
        """The last strong progress over ``pids`` that was work, not collectives completing."""
        return max((x for p in pids if (x := self.of(p).last_work) is not None), default=None)

    def why_strongest(self, pids: list[int]) -> str:
        best = max(pids, key=lambda p: self.of(p).last_strong or 0)
        return f"pid {best}: {self.of(best).why}"
