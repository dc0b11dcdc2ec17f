"""The analysis: snapshots in; process states with reasons, hang incidents with culprits out.

Fed one snapshot at a time (live or replayed, the same code). Per process it decides a *local*
reading from its own signals (GPU work, GPU spinning, I/O, log lines, stacks); per job it decides
who waits for whom and whether the job as a whole still progresses. A job is hung only when no
rank of it progresses and at least one rank is positively stuck (spinning in a GPU collective,
or blocked host-side in a collective according to its stack, or stopped).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hangd.analysis import stackcat
from hangd.analysis.jobs import Job, group_jobs
from hangd.analysis.signals import GiB, NodeView, ProcSignals, Thresholds, proc_signals
from hangd.flightrec.analyze import Finding, analyze
from hangd.flightrec.reader import DumpError, decode
from hangd.incidents import HANG_KINDS, Incident, IncidentBook
from hangd.redact import redact_text
from hangd.snapshot import Snapshot
from hangd.sources.ras import parse_ras_text

log = logging.getLogger("hangd.analysis")

STATES = ("starting", "loading", "compiling", "graph_capture", "busy", "idle", "waiting_peer",
          "straggler", "hung", "orphaned")
REQUEST_WCHANS = ("inet_csk_accept", "ep_poll", "do_epoll_wait", "do_select", "do_sys_poll", "unix_stream_read",
                  "sk_wait_data", "pipe_read", "do_poll")
WAIT_VERDICTS = ("collective", "store")


@dataclass
class StateChange:
    t: float
    pid: int
    rank: int | None
    job: str | None
    state: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"t": round(self.t, 3), "pid": self.pid, "rank": self.rank, "job": self.job, "state": self.state,
                "reason": self.reason, "evidence": self.evidence}


@dataclass
class Requests:
    """What the analysis would like the sources to capture next (ignored on replay)."""

    stacks: list[tuple[int, bool]] = field(default_factory=list)  # (pid, native)
    fr_dumps: list[int] = field(default_factory=list)
    ras: bool = False  # ask NCCL's RAS thread for its view


@dataclass
class _Proc:
    state: str | None = None
    since: float = 0.0
    reason: str = ""
    pending: str | None = None
    pending_since: float = 0.0
    started: bool = False
    last_progress: float | None = None
    last_strong: float | None = None
    progress_why: str = ""
    verdict: stackcat.Verdict = stackcat.UNKNOWN
    verdict_t: float | None = None
    verdict_wchan: str | None = None  # where the kernel had it blocked when the stack was taken
    stack_sig: tuple[str, ...] = ()
    stack_sig_t: float | None = None
    local: str = "quiet"
    local_why: str = ""
    spinning: bool = False
    io_since: float | None = None
    chars_since: float | None = None
    strong_secs: deque[int] = field(default_factory=lambda: deque(maxlen=300))  # seconds with strong progress


@dataclass
class _Job:
    quiet_since: float | None = None
    hung: bool = False
    hung_at: float | None = None
    stacks_asked: list[float] = field(default_factory=list)
    native_asked: bool = False
    fr_asked: float | None = None
    episode: frozenset[int] | None = None
    episode_start: float = 0.0
    episodes: deque[tuple[float, frozenset[int]]] = field(default_factory=lambda: deque(maxlen=64))
    blame: deque[tuple[int, frozenset[int], frozenset[int]]] = field(default_factory=deque)  # (second, waited for, waiters)
    exited: dict[int, float] = field(default_factory=dict)
    fr: dict[int, tuple[float, Any]] = field(default_factory=dict)  # rank -> (t, Dump)
    fr_pids: dict[int, int] = field(default_factory=dict)  # rank -> pid of the process that dumped
    fr_keys: set[tuple[str, str | None, int | None]] = field(default_factory=set)
    findings: list[Finding] = field(default_factory=list)


class Analyzer:
    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.th = thresholds or Thresholds()
        self.view = NodeView()
        self.book = IncidentBook()
        self.procs: dict[int, _Proc] = {}
        self.jobs: dict[str, _Job] = {}
        self.job_defs: dict[str, Job] = {}
        self.changes: list[StateChange] = []
        self.findings: list[dict[str, Any]] = []
        self.requests = Requests()
        self.signals: dict[int, ProcSignals] = {}
        self._pid_job: dict[int, str] = {}
        self._unattributed: dict[int, float] = {}

    # ------------------------------------------------------------------ feeding

    def feed(self, snap: Snapshot) -> list[StateChange]:
        self.view.feed(snap)
        t = snap.t
        for pid in self.view.new_stacks:
            self._stack_arrived(pid, t)
        if snap.fr_dumps:
            self._fr_arrived(snap, t)
        for r in snap.ras:
            self._ras_arrived(r.text, t)
        if not snap.procs:
            return []
        return self.evaluate(t)

    def _p(self, pid: int) -> _Proc:
        p = self.procs.get(pid)
        if p is None:
            p = self.procs[pid] = _Proc()
        return p

    def _stack_arrived(self, pid: int, t: float) -> None:
        h = self.view.procs[pid]
        samples = h.stacks[-1][1]
        good = [s for s in samples if s.threads]
        if not good:
            return
        p = self._p(pid)
        v = stackcat.classify(good)
        py = [s for s in good if not s.native]
        sig = max((stackcat.signature(s) for s in py), key=len) if py else ()
        if p.stack_sig and sig and sig != p.stack_sig and p.stack_sig_t is not None:
            # it moved some time after the earlier capture: credit that moment, not this one
            self._progress(pid, p.stack_sig_t + 0.01, "its stack changed between two captures", strong=True)
        if sig:
            p.stack_sig, p.stack_sig_t = sig, t
        if v.known or p.verdict_t is None or t - p.verdict_t > 1.0:
            p.verdict, p.verdict_t = v, t
            lp = h.latest()
            p.verdict_wchan = lp.wchan if lp is not None else None

    def _fr_arrived(self, snap: Snapshot, t: float) -> None:
        by_job: dict[str, list[int]] = {}
        for d in snap.fr_dumps:
            if d.data is None:
                continue
            try:
                dump = decode(d.data, d.rank)
            except DumpError as e:
                self.findings.append({"t": round(t, 3), "kind": "unreadable", "pid": d.pid, "rank": d.rank,
                                      "message": f"{d.path}: {e}", "source": d.source})
                continue
            pid = d.pid
            job_id = self._pid_job.get(pid) if pid is not None else None
            if job_id is None:
                jobs = group_jobs(self.view)
                job_id = next((j.id for j in jobs.values() if pid in j.ranks), f"fr:{d.path.rsplit('/', 1)[0]}")
            js = self.jobs.setdefault(job_id, _Job())
            rank = dump.rank if dump.rank is not None else d.rank
            if rank is None:
                continue
            prev = js.fr.get(rank)
            if prev is not None and pid is not None:
                old_done = max((s.get("last_completed_collective") or 0 for s in prev[1].pg_status.values()), default=0)
                new_done = max((s.get("last_completed_collective") or 0 for s in dump.pg_status.values()), default=0)
                if new_done > old_done:
                    # credit when the newest completed collective was issued, not when the dump came
                    created = [e.time_created_ns for e in dump.entries if e.completed and e.time_created_ns]
                    at = min(t, max(created) / 1e9) if created else prev[0] + 0.01
                    self._progress(pid, at, f"flight recorder: completed collectives {old_done} -> {new_done}", strong=True)
            js.fr[rank] = (t, dump)
            if pid is not None:
                js.fr_pids[rank] = pid
            by_job.setdefault(job_id, []).append(rank)
        for job_id in by_job:
            js = self.jobs[job_id]
            dumps = [d for (_, d) in js.fr.values()]
            for f in analyze(dumps):
                key = (f.kind, f.pg, f.seq)
                if key in js.fr_keys:
                    continue
                if f.kind in ("missing_rank", "stuck") and self._job_progressing(job_id, t):
                    continue  # a dump of a job that still progresses catches collectives in flight
                js.fr_keys.add(key)
                f.source = "flight_recorder"
                js.findings.append(f)
                fd = {"t": round(t, 3), "job": job_id, **f.to_dict()}
                self.findings.append(fd)
                if f.kind in ("op_mismatch", "size_mismatch", "dtype_mismatch"):
                    self._mismatch_incident(job_id, js, f, t)
                inc = self.book.get(job_id, "hang")
                if inc is not None:
                    self._attach_fr(inc, js, t)

    def _ras_arrived(self, text: str, t: float) -> None:
        """NCCL RAS's view (which rank launched fewer operations, which are missing), attached to
        the open hang incident of the job whose processes it names."""
        st = parse_ras_text(text)
        pids = {x["pid"] for x in st.launched} | {x["pid"] for x in st.missing}
        d = {"t": round(t, 3), "kind": "nccl_ras", "source": "nccl_ras", **st.to_dict()}
        self.findings.append(d)
        for (_job, family), inc in self.book.open.items():
            if family == "hang" and pids & set(inc.pids):
                inc.evidence["nccl_ras"] = d
                behind = st.behind()
                note = ("NCCL RAS: " + "; ".join(f"rank {x['rank']} (pid {x['pid']}) launched up to {st.op or 'operation'} "
                                                  f"#{x['op']}" for x in sorted(st.launched, key=lambda x: x["rank"])))
                if behind:
                    inc.findings.append({"kind": "ras_behind", "source": "nccl_ras", "ranks": [x["rank"] for x in behind],
                                         "pids": [x["pid"] for x in behind], "message": note})
                self.book.touch(inc, t, note)

    def _job_progressing(self, job_id: str, t: float) -> bool:
        job = self.job_defs.get(job_id)
        if job is None:
            return False
        return any((self.procs[p].last_strong or -1e18) >= t - self.th.stack_quiet_s
                   for p in job.pids if p in self.procs)

    def _progress(self, pid: int, t: float, why: str, strong: bool) -> None:
        p = self._p(pid)
        if p.last_progress is None or t >= p.last_progress:
            p.last_progress = t
            p.progress_why = why
        if strong and (p.last_strong is None or t >= p.last_strong):
            p.last_strong = t
        if strong and (not p.strong_secs or int(t) > p.strong_secs[-1]):
            p.strong_secs.append(int(t))

    # ------------------------------------------------------------------ per process

    def _evidence_of_progress(self, pid: int, s: ProcSignals, t: float) -> None:
        th = self.th
        p = self._p(pid)
        if s.state == "Z":
            return
        if s.gpu.any_work() and s.gpu_work_at is not None:
            g = s.gpu
            self._progress(pid, s.gpu_work_at, f"GPU {s.gpu_indexes[0]} working (tensor {g.tensor or 0:.0f}%, DRAM {g.dram or 0:.0f}%, "
                           f"NVLink {g.nvlink_mibs or 0:.0f} MiB/s)" if g.has_gpm else
                           f"GPU {s.gpu_indexes[0]} memory controller {g.util_mem or 0:.0f}% busy", strong=True)
        if abs(s.gpu_mem_change) >= th.gpu_mem_change_bytes:
            self._progress(pid, t, f"GPU memory changed by {s.gpu_mem_change / GiB:+.2f} GiB", strong=True)
        io = (s.read_per_s or 0) + (s.write_per_s or 0)
        if io >= th.io_bytes_per_s:
            if p.io_since is None:
                p.io_since = t
            # a short burst (a dump being written) is not progress of a hung job; sustained I/O is
            self._progress(pid, t, f"disk I/O {io / 1e6:.0f} MB/s", strong=t - p.io_since >= 3.0)
        else:
            p.io_since = None
        if s.log_grew_at is not None and t - s.log_grew_at <= th.window_s:
            self._progress(pid, s.log_grew_at, "its log grew", strong=True)
        if not s.gpu_indexes and (s.rchar_per_s or 0) + (s.wchar_per_s or 0) >= th.socket_char_per_s and (s.cpu_cores or 0) >= 0.02:
            # read/write syscalls also count file reads (imports, a dump being written): only data
            # moving for a while, as a CPU job's collectives do step after step, is progress
            if p.chars_since is None:
                p.chars_since = t
            if t - p.chars_since >= 3.0:  # weak: a dump being written reads and writes too
                self._progress(pid, t, "it moves data (read/write syscalls)", strong=False)
        else:
            p.chars_since = None
        if s.rss_change is not None and abs(s.rss_change) >= th.rss_change_bytes:
            self._progress(pid, t, f"host memory changed by {s.rss_change / GiB:+.2f} GiB", strong=False)

    def _local(self, pid: int, s: ProcSignals, t: float) -> tuple[str, str]:
        """What this process does, judged on its own."""
        th = self.th
        p = self._p(pid)
        # A stack describes the process only while it stays where it was: no progress since, and
        # blocked at the same kernel wait point (a sleeping straggler caught once inside a fast
        # collective is not waiting in it).
        fresh = p.verdict_t is not None and t - p.verdict_t <= 60 and \
            (p.last_strong is None or p.last_strong <= p.verdict_t + th.window_s) and \
            (p.verdict_wchan is None or s.wchan is None or p.verdict_wchan == s.wchan)
        v = p.verdict if fresh else stackcat.UNKNOWN
        g = s.gpu
        works = g.works(th)
        p.spinning = False
        if s.state == "Z":
            return "zombie", "zombie: exited, not yet reaped"
        if s.state == "T":
            return "stopped", "stopped (SIGSTOP or a debugger): it runs no code at all"
        # reading fast *and* the data going somewhere (GPU memory, host memory) or waiting on the disk;
        # importing python packages at start reads too, but into nothing
        filling = (s.gpu_mem_rate > 0 or s.d_fraction >= 0.25) and (bool(s.gpu_indexes) or s.age_s >= th.startup_cpu_s)
        reading = filling and ((s.read_per_s or 0) >= th.load_read_per_s
                               or (s.rchar_per_s or 0) >= th.load_rchar_per_s)
        if not works and (reading or v.kind == "loading" or ("loading" in s.log_kinds and s.d_fraction > 0)):
            why = f"reading {((s.read_per_s or 0) + (s.rchar_per_s or 0)) / 1e6:.0f} MB/s from disk" if reading else \
                (f"its stack is {v.why} ({v.frame})" if v.kind == "loading" else "its log says it loads weights")
            if s.gpu_mem_rate > 0:
                why += f", GPU memory growing {s.gpu_mem_rate / 1e6:.0f} MB/s"
            return "loading", why
        if v.kind == "graph_capture":
            return "graph_capture", f"its stack is capturing a CUDA graph ({v.frame})"
        growing = min(s.gpu_mem_rate, s.gpu_mem_rate_before) >= th.capture_growth_per_s
        saturated = (g.util or 0) >= 98 and (g.sm or 0) >= 75
        if g.active(th) and ("graph_capture" in s.log_kinds or (growing and not saturated)):
            why = "its log says it captures CUDA graphs" if "graph_capture" in s.log_kinds else \
                f"GPU memory growing {s.gpu_mem_rate / 1e6:.0f} MB/s while the GPU runs short bursts"
            return "graph_capture", why + f" (util {g.util or 0:.0f}%, SM {g.sm or 0:.0f}%)"
        if works:
            return "busy", (f"GPU working: tensor {g.tensor or 0:.0f}%, DRAM {g.dram or 0:.0f}%, NVLink "
                            f"{g.nvlink_mibs or 0:.0f} MiB/s, {g.power_w or 0:.0f} W") if g.has_gpm else \
                f"GPU working: util {g.util or 0:.0f}%, memory controller {g.util_mem or 0:.0f}%"
        if v.kind == "compiling" or "compiling" in s.log_kinds or (s.compile_children > 0 and (s.cpu_cores or 0) >= 0.3):
            why = f"its stack is compiling ({v.frame})" if v.kind == "compiling" else \
                f"{s.compile_children} compiler processes under it" if s.compile_children else "its log says it compiles"
            return "compiling", why
        if g.spins(th):
            p.spinning = True
            return "waiting", (f"spinning in a GPU collective: util {g.util or 0:.0f}% but SM {g.sm or 0:.0f}%, "
                               f"tensor {g.tensor or 0:.0f}%, DRAM {g.dram or 0:.0f}%, no NVLink traffic, "
                               f"{g.power_w or 0:.0f} W") if g.has_gpm else \
                f"spinning on the GPU: util {g.util or 0:.0f}% with the memory controller idle"
        if v.kind in WAIT_VERDICTS:
            return "waiting", f"its stack is {v.why}: {v.frame}"
        recent = p.last_strong is not None and t - p.last_strong <= th.window_s
        if not s.gpu_indexes and (s.cpu_cores or 0) >= 0.02 and recent:
            return "busy", f"on CPU ({s.cpu_cores or 0:.1f} cores) and progressing: {p.progress_why}"
        if v.kind == "request_wait" or (s.wchan or "") in REQUEST_WCHANS:
            return "idle", (f"its stack is {v.why} ({v.frame})" if v.kind == "request_wait"
                            else f"sleeping in {s.wchan}: waiting for requests")
        if s.d_fraction >= 0.5:
            return "io_wait", f"in uninterruptible I/O (wchan {s.wchan})"
        if (s.cpu_cores or 0) >= th.busy_cpu_cores and s.state == "R":
            # the main thread runs; a side thread alone (a dump being written) is not the job working
            return "cpu", f"on CPU ({s.cpu_cores or 0:.1f} cores)"
        what = f"its stack is {v.why} ({v.frame})" if v.known else f"sleeping (state {s.state}, wchan {s.wchan})"
        return "quiet", what + (f"; GPU idle, {s.gpu_mem / GiB:.1f} GiB held" if s.gpu_indexes else "")

    # ------------------------------------------------------------------ per tick

    def evaluate(self, t: float) -> list[StateChange]:
        out: list[StateChange] = []
        self.job_defs = group_jobs(self.view)
        for job in self.job_defs.values():
            out.extend(self._evaluate_job(job, t))
        self._unattributed_memory(t)
        self._resolve_gone_jobs(t)
        self.changes.extend(out)
        return out

    def _evaluate_job(self, job: Job, t: float) -> list[StateChange]:
        th = self.th
        js = self.jobs.setdefault(job.id, _Job())
        live: list[int] = []
        for pid in job.pids:
            self._pid_job[pid] = job.id
            h = self.view.procs[pid]
            lp = h.latest()
            if h.gone_at is not None or lp is None or lp.state in ("Z", "X"):
                js.exited.setdefault(pid, h.gone_at or h.zombie_since or t)
                continue
            live.append(pid)
        sigs: dict[int, ProcSignals] = {}
        for pid in live:
            s = sigs[pid] = proc_signals(self.view, pid, t, th)
            self.signals[pid] = s
            self._evidence_of_progress(pid, s, t)
        locals_: dict[int, tuple[str, str]] = {pid: self._local(pid, sigs[pid], t) for pid in live}
        for pid, (loc, why) in locals_.items():
            p = self._p(pid)
            p.local, p.local_why = loc, why

        # progress of the job as a whole
        lasts = [x for pid in live if (x := self.procs[pid].last_progress) is not None]
        firsts = [self.view.procs[pid].first_seen for pid in live]
        last_progress = max(lasts) if lasts else (min(firsts) if firsts else t)
        quiet = t - last_progress
        last_strong = max((self.procs[pid].last_strong or 0.0 for pid in live), default=0.0)

        waiting = {pid for pid in live if locals_[pid][0] == "waiting"}
        spinning = {pid for pid in waiting if self.procs[pid].spinning}
        stopped = {pid for pid in live if locals_[pid][0] == "stopped"}
        io_stuck = {pid for pid in live if locals_[pid][0] == "io_wait"}
        orphans = {pid for pid in live if self._orphaned(pid)}

        # -- hang decision
        kind = None
        if live and not (live and all(locals_[p][0] == "busy" for p in live)):
            if spinning and quiet >= th.hang_gpu_s:
                kind = "nccl_stall"
            elif stopped and quiet >= th.hang_gpu_s and (waiting or len(live) == 1):
                kind = "nccl_stall" if spinning else "host_stall"
            elif waiting and quiet >= th.hang_host_s:
                kind = "host_stall"
            elif io_stuck and quiet >= th.hang_io_s:
                kind = "io_stall"
        inc = self.book.get(job.id, "hang")
        if js.hung:
            # a hung job un-hangs only on strong progress after it was judged hung
            if live and last_strong > (js.hung_at or t):
                js.hung = False
                if inc is not None:
                    self.book.resolve(inc, t, f"progress resumed: {self._why_progress(live)}")
            elif not live:
                js.hung = False
                if inc is not None:
                    self.book.resolve(inc, t, "the job's processes are gone")
        elif kind is not None:
            js.hung, js.hung_at = True, t
        exited_inc = self._rank_exits(job, js, live, t)
        if js.hung and kind is None and inc is not None:
            kind = inc.kind
        if js.hung and kind is not None:
            inc = self.book.get(job.id, "hang")
            if inc is None and exited_inc is None:
                inc = self.book.open_incident(kind, job.id, t, hang_started_at=last_progress)
            if inc is not None and inc.kind in HANG_KINDS:
                self._fill_hang(inc, job, js, live, sigs, locals_, spinning, stopped, waiting, quiet, t)
        elif inc is not None and inc.kind == "rank_exited" and not live:
            self.book.resolve(inc, t, "the job's processes are gone")

        self._straggler(job, js, live, waiting, t)
        self._orphan_incident(job, orphans, sigs, t)
        self._ask_for_evidence(job, js, live, quiet, t)

        # -- states
        # A single wait shorter than the hang threshold is a blip (or the first seconds of a hang):
        # ranks keep their state. A wait that recurs, or lasts while the job still progresses,
        # shows who waits for whom.
        recurring = js.episode is not None and any(
            js.episode_start - th.straggler_window_s <= tt < js.episode_start - 0.5 for tt, _ in js.episodes)
        hold = bool(waiting) and not recurring and t - js.episode_start < th.hang_gpu_s
        changes = []
        for pid in live:
            loc, why = locals_[pid]
            p = self._p(pid)
            if loc == "zombie":
                continue
            if pid in orphans:
                state, reason = "orphaned", self._orphan_reason(pid) + f"; now {why}"
            elif js.hung:
                hinc = self.book.get(job.id, "hang")
                state = "hung"
                reason = (f"job hung: no rank has progressed for {quiet:.0f} s; this rank: {why}"
                          + (f" (incident #{hinc.id} {hinc.kind})" if hinc else ""))
            elif (hold or (loc == "stopped" and not waiting)) and p.state not in (None, "starting") \
                    and loc in ("waiting", "quiet", "cpu", "stopped"):
                state, reason = str(p.state), p.reason
            elif loc == "waiting":
                others = [o for o in live if o != pid and o not in waiting]
                state = "waiting_peer"
                reason = why + (f"; waiting for rank {', '.join(str(job.ranks[o]) for o in others)}" if others else "")
            elif loc in ("stopped",) or (waiting and pid not in waiting and loc != "zombie"):
                state = "straggler"
                waiters = ", ".join(str(job.ranks[w]) for w in sorted(waiting))
                reason = f"rank{'s' if len(waiting) > 1 else ''} {waiters} wait{'s' if len(waiting) == 1 else ''} for it in a collective; this rank: {why}" if waiting else why
            else:
                state = {"busy": "busy", "cpu": "busy", "quiet": "idle", "idle": "idle", "loading": "loading",
                         "graph_capture": "graph_capture", "compiling": "compiling", "io_wait": "loading"}.get(loc, "idle")
                reason = why
            if not p.started:
                # Setting up ends with the first sign of what the process is for: GPU work, loading,
                # capture, compiling, a wait, a request loop, or a stack that says where it is.
                conclusive = state in ("loading", "graph_capture", "compiling", "waiting_peer", "straggler", "hung",
                                       "orphaned") \
                    or (state == "busy" and loc == "busy" and bool(sigs[pid].gpu_indexes)) \
                    or loc == "idle" or (loc == "quiet" and p.verdict.known and p.verdict_t is not None) \
                    or sigs[pid].age_s >= th.startup_max_s
                if loc in ("cpu", "busy") and not sigs[pid].gpu_indexes:
                    conclusive = sigs[pid].age_s >= th.startup_cpu_s and p.last_strong is not None
                if conclusive:
                    p.started = True
                else:
                    state, reason = "starting", f"started {sigs[pid].age_s:.0f} s ago and still setting up: {why}"
            ch = self._set_state(pid, job, state, reason, t, sigs[pid])
            if ch is not None:
                changes.append(ch)
        for pid in list(js.exited):
            p = self._p(pid)
            if p.state is not None and p.state != "gone" and self.view.procs.get(pid) is not None \
                    and self.view.procs[pid].gone_at is not None:
                p.state, p.since, p.pending = "gone", t, None
                changes.append(StateChange(t, pid, job.ranks.get(pid), job.id, "gone", "the process exited"))
        return changes

    def _set_state(self, pid: int, job: Job, state: str, reason: str, t: float, s: ProcSignals) -> StateChange | None:
        p = self._p(pid)
        if state == p.state:
            p.pending = None
            p.reason = reason
            return None
        immediate = p.state is None or state in ("hung", "orphaned")
        if not immediate:
            if p.pending != state:
                p.pending, p.pending_since = state, t
                return None
            if t - p.pending_since < self.th.dwell_s:
                return None
        p.state, p.since, p.reason, p.pending = state, t, reason, None
        return StateChange(t, pid, job.ranks.get(pid), job.id, state, reason, {"signals": s.brief()})

    def _why_progress(self, pids: list[int]) -> str:
        best = max(pids, key=lambda p: self.procs[p].last_strong or 0)
        return f"pid {best}: {self.procs[best].progress_why}"

    # ------------------------------------------------------------------ incidents

    def _fill_hang(self, inc: Incident, job: Job, js: _Job, live: list[int], sigs: dict[int, ProcSignals],
                   locals_: dict[int, tuple[str, str]], spinning: set[int], stopped: set[int],
                   waiting: set[int], quiet: float, t: float) -> None:
        culprits: set[int] = set(stopped)
        fr_missing = [f for f in js.findings if f.kind == "missing_rank"]
        if not culprits and fr_missing:
            rank_pid = {r: p for p, r in job.ranks.items()}
            culprits = {rank_pid[r] for f in fr_missing[:1] for r in f.missing_ranks if r in rank_pid}
        if not culprits and waiting:
            culprits = {pid for pid in live if pid not in waiting}
        inc.pids = list(job.pids)
        inc.ranks = [job.ranks[p] for p in job.pids]
        inc.culprit_pids = sorted(culprits, key=lambda p: job.ranks.get(p, 0))
        inc.culprit_ranks = [job.ranks[p] for p in inc.culprit_pids]
        waiters = sorted(waiting - culprits, key=lambda p: job.ranks.get(p, 0))
        parts = []
        if inc.culprit_pids:
            who = ", ".join(f"rank {job.ranks[p]} (pid {p})" for p in inc.culprit_pids)
            parts.append(f"{who} {'is' if len(inc.culprit_pids) == 1 else 'are'} not in the collective "
                         f"{'its' if len(inc.culprit_pids) == 1 else 'their'} peers wait in: "
                         + "; ".join(f"rank {job.ranks[p]}: {locals_[p][1]}" for p in inc.culprit_pids if p in locals_))
        if waiters:
            parts.append("; ".join(f"rank {job.ranks[p]} has waited {quiet:.0f} s: {locals_[p][1]}" for p in waiters if p in locals_))
        if not inc.culprit_pids and not waiters:
            parts.append(f"no rank has progressed for {quiet:.0f} s")
        for p in inc.culprit_pids:
            st = self._stack_brief(p)
            if st:
                parts.append(f"rank {job.ranks[p]}'s stack: " + " <- ".join(st["frames"][:4]))
        if fr_missing:
            parts.insert(0, "Flight recorder: " + fr_missing[0].message)
        inc.summary = ". ".join(parts) + "."
        inc.evidence = self._evidence(job, js, live, sigs, quiet)
        self._attach_fr(inc, js, t, touch=False)
        self.book.touch(inc, t, f"culprit ranks {inc.culprit_ranks}" if inc.culprit_ranks else "no culprit identified yet")

    def _attach_fr(self, inc: Incident, js: _Job, t: float, touch: bool = True) -> None:
        inc.findings = [f.to_dict() for f in js.findings]
        inc.evidence["flight_recorder"] = inc.findings
        miss = next((f for f in js.findings if f.kind == "missing_rank"), None)
        if miss is not None and "Flight recorder" not in inc.summary:
            inc.summary = "Flight recorder: " + miss.message + ". " + inc.summary
            job = self.job_defs.get(inc.job)
            if job is not None and not inc.culprit_pids:
                rank_pid = {r: p for p, r in job.ranks.items()}
                inc.culprit_pids = [rank_pid[r] for r in miss.missing_ranks if r in rank_pid]
                inc.culprit_ranks = list(miss.missing_ranks)
        if touch:
            self.book.touch(inc, t, "flight-recorder findings attached")

    def _stack_brief(self, pid: int) -> dict[str, Any] | None:
        h = self.view.procs.get(pid)
        if h is None or not h.stacks:
            return None
        t, samples = h.stacks[-1]
        p = self._p(pid)
        # the newest Python-level capture and the newest native one (they may come at different ticks)
        py = next((s for _, ss in reversed(h.stacks) for s in ss if not s.native and s.threads), None)
        native = next((s for _, ss in reversed(h.stacks) for s in ss if s.native and s.threads), None)
        py = py or native
        out: dict[str, Any] = {"pid": pid, "t": round(t, 3), "verdict": p.verdict.kind, "why": p.verdict.why,
                               "frame": p.verdict.frame, "frames": stackcat.summarize(py, 12) if py else [],
                               "threads": len(py.threads) if py else 0, "captures": len(h.stacks)}
        if native is not None:
            out["native_frames"] = stackcat.summarize(native, 24)
        errors = [s.error for s in samples if s.error]
        sigs = {stackcat.signature(s) for _, ss in h.stacks for s in ss if not s.native and s.threads}
        py_caps = sum(1 for _, ss in h.stacks for s in ss if not s.native and s.threads)
        if py_caps >= 2:
            out["unchanged_across_captures"] = len(sigs) == 1
        if errors:
            out["errors"] = errors
        return out

    def _evidence(self, job: Job, js: _Job, live: list[int], sigs: dict[int, ProcSignals], quiet: float) -> dict[str, Any]:
        ev: dict[str, Any] = {"quiet_for_s": round(quiet, 1), "stacks": {}, "processes": {}, "logs": {},
                              "environ": {}, "gpus": {}}
        for pid in job.pids:
            r = str(job.ranks[pid])
            st = self._stack_brief(pid)
            if st:
                ev["stacks"][r] = st
            if pid in sigs:
                ev["processes"][r] = {"pid": pid, "local": self.procs[pid].local, "why": self.procs[pid].local_why,
                                      "last_progress": self.procs[pid].progress_why, **sigs[pid].brief()}
            h = self.view.procs.get(pid)
            if h is not None and h.info is not None:
                ev["environ"][r] = dict(h.info.environ or {})
                for target in {v for v in (h.info.fds or {}).values() if v}:
                    fs = self.view.files.get(target)
                    if fs is not None and fs.tail:
                        ev["logs"][r] = [redact_text(x) for x in fs.tail.splitlines()[-20:]]
            for idx in (sigs[pid].gpu_indexes if pid in sigs else []):
                dq = self.view.gpus.get(idx)
                if dq:
                    g = dq[-1][1]
                    ev["gpus"][str(idx)] = {"util_gpu": g.util_gpu, "util_mem": g.util_mem, "power_w":
                                            (g.power_mw or 0) / 1000, "mem_used": g.mem_used, "gpm": g.gpm}
        return ev

    def _mismatch_incident(self, job_id: str, js: _Job, f: Finding, t: float) -> None:
        inc = self.book.get(job_id, "mismatch")
        job = self.job_defs.get(job_id)
        rank_pid = {**js.fr_pids, **({r: p for p, r in job.ranks.items()} if job else {})}
        if inc is None:
            inc = self.book.open_incident("collective_mismatch", job_id, t)
            inc.ranks = sorted(f.ranks)
            inc.pids = [rank_pid[r] for r in inc.ranks if r in rank_pid]
            inc.summary = (f"{f.message}. The ranks disagree on one collective: NCCL completes it with silently wrong "
                           "results, gloo fails the job.")
            # the odd one out: the rank whose size/op differs from the majority (else the higher rank)
            vals = f.sizes if f.kind == "size_mismatch" else f.ops if f.kind == "op_mismatch" else f.dtypes
            counts: dict[str, int] = {}
            for v in vals.values():
                counts[repr(v)] = counts.get(repr(v), 0) + 1
            odd = [r for r, v in vals.items() if counts[repr(v)] == 1 and len(vals) > 2] or [max(vals)]
            inc.culprit_ranks = sorted(odd)
            inc.culprit_pids = [rank_pid[r] for r in inc.culprit_ranks if r in rank_pid]
        inc.findings.append(f.to_dict())
        inc.evidence["flight_recorder"] = inc.findings
        self.book.touch(inc, t, f.message)

    def _rank_exits(self, job: Job, js: _Job, live: list[int], t: float) -> Incident | None:
        th = self.th
        inc = self.book.get(job.id, "hang")
        if not js.exited or not live:
            return inc if inc is not None and inc.kind == "rank_exited" else None
        holders = [p for p in live if self.signals.get(p) and self.signals[p].gpu_mem > 0] or live
        first_exit = min(js.exited.values())
        if t - first_exit < th.rank_exit_grace_s or not holders:
            return None
        if inc is None:
            exited = sorted(js.exited, key=lambda p: job.ranks.get(p, 0))
            inc = self.book.open_incident("rank_exited", job.id, t, hang_started_at=first_exit)
            inc.pids = list(job.pids)
            inc.ranks = [job.ranks[p] for p in job.pids]
            inc.culprit_pids = exited
            inc.culprit_ranks = [job.ranks[p] for p in exited if p in job.ranks]
            left = ", ".join(f"rank {job.ranks[p]} (pid {p})" for p in holders)
            inc.summary = (f"rank {', '.join(str(r) for r in inc.culprit_ranks)} exited {t - first_exit:.0f} s ago "
                           f"while {left} still run and hold the GPU: they will wait for it until their collective timeout")
            inc.evidence = self._evidence(job, js, live, self.signals, t - first_exit)
            for p in exited:
                h = self.view.procs.get(p)
                if h is not None and h.info:
                    for target in {v for v in (h.info.fds or {}).values() if v}:
                        fs = self.view.files.get(target)
                        if fs is not None and fs.tail:
                            inc.evidence["logs"][str(job.ranks[p])] = [redact_text(x) for x in fs.tail.splitlines()[-20:]]
        return inc if inc.kind == "rank_exited" else None

    def _straggler(self, job: Job, js: _Job, live: list[int], waiting: set[int], t: float) -> None:
        """A rank that others keep waiting for while the job still progresses: in the window, the
        seconds its peers spent waiting on it (not a hang: a hang opens its own incident)."""
        th = self.th
        culprits = frozenset(p for p in live if p not in waiting) if waiting else None
        if culprits is not None and not js.hung:
            if js.episode != culprits:
                js.episode, js.episode_start = culprits, t
                js.episodes.append((t, culprits))
            if len(live) > 1 and culprits:
                js.blame.append((int(t), culprits, frozenset(waiting)))
        else:
            js.episode = None
        while js.blame and t - js.blame[0][0] > th.straggler_window_s:
            js.blame.popleft()
        seconds: dict[int, set[int]] = {}
        for sec, c, _ in js.blame:
            for p in c:
                seconds.setdefault(p, set()).add(sec)
        blamed = {p: len(secs) for p, secs in seconds.items() if p in live}
        # the waiting ranks must have got through their collectives several times meanwhile: a rank
        # that makes them wait for good is a hang in the making, not a straggler
        first_blame = js.blame[0][0] if js.blame else t
        victims = {p for _, _, w in js.blame for p in w}
        progressed = len({sec for p in victims if p in self.procs for sec in self.procs[p].strong_secs if sec >= first_blame})
        worst = [p for p, n in blamed.items() if n >= th.straggler_wait_s] if not js.hung and progressed >= 3 else []
        inc = self.book.get(job.id, "straggler")
        if worst and inc is None:
            inc = self.book.open_incident("straggler", job.id, t)
            inc.pids = list(job.pids)
            inc.ranks = [job.ranks[p] for p in job.pids]
        if inc is None:
            return
        if worst:
            changed = sorted(worst, key=lambda p: job.ranks.get(p, 0)) != inc.culprit_pids
            inc.culprit_pids = sorted(worst, key=lambda p: job.ranks.get(p, 0))
            inc.culprit_ranks = [job.ranks[p] for p in inc.culprit_pids]
            waiters = sorted({job.ranks[p] for p in live if p not in worst})
            inc.summary = (f"rank {', '.join(map(str, inc.culprit_ranks))} kept rank{'s' if len(waiters) > 1 else ''} "
                           f"{', '.join(map(str, waiters))} waiting in collectives for {max(blamed[p] for p in worst)} s "
                           f"of the last {th.straggler_window_s:.0f} s while the job still progressed")
            inc.evidence = {"wait_seconds_by_rank": {str(job.ranks[p]): n for p, n in blamed.items()},
                            "culprit": {str(job.ranks[p]): self.procs[p].local_why for p in worst}}
            self.book.touch(inc, t, f"culprit ranks {inc.culprit_ranks}" if changed else None)
        elif not live or js.hung or not js.blame or t - js.blame[-1][0] > 60:
            self.book.resolve(inc, t, "the job is gone or hung" if not live or js.hung else
                              "no rank has made the others wait for 60 s")

    def _orphaned(self, pid: int) -> bool:
        h = self.view.procs[pid]
        lp = h.latest()
        if lp is None or h.first_ppid is None or h.first_ppid <= 1:
            return False
        parent = self.view.procs.get(h.first_ppid)
        parent_gone = parent is None or parent.gone_at is not None or \
            (parent.latest() is not None and parent.latest().state == "Z")  # type: ignore[union-attr]
        return lp.ppid != h.first_ppid and parent_gone or (parent is not None and parent.gone_at is not None)

    def _orphan_reason(self, pid: int) -> str:
        h = self.view.procs[pid]
        lp = h.latest()
        return f"its launcher (pid {h.first_ppid}) is gone; re-parented to pid {lp.ppid if lp else '?'}"

    def _orphan_incident(self, job: Job, orphans: set[int], sigs: dict[int, ProcSignals], t: float) -> None:
        inc = self.book.get(job.id, "orphan")
        holding = sorted((p for p in orphans if sigs.get(p) and sigs[p].gpu_mem > 0), key=lambda p: job.ranks.get(p, 0))
        zombies = [p for p in job.pids if (h := self.view.procs.get(p)) and h.zombie_since and t - h.zombie_since >= self.th.orphan_gpu_s
                   and p in self.view.gpu_of and t - self.view.gpu_seen_at.get(p, -1e9) < 5]
        holding += [p for p in zombies if p not in holding]
        if holding and inc is None:
            inc = self.book.open_incident("orphaned_gpu_memory", job.id, t)
        if inc is not None:
            if holding:
                total = sum(sigs[p].gpu_mem if p in sigs else sum(v or 0 for v in self.view.gpu_of.get(p, {}).values()) for p in holding)
                inc.pids = list(job.pids)
                inc.ranks = [job.ranks[p] for p in job.pids]
                inc.culprit_pids = holding
                inc.culprit_ranks = [job.ranks[p] for p in holding]
                inc.summary = (f"{len(holding)} process{'es' if len(holding) > 1 else ''} of job {job.name} hold "
                               f"{total / GiB:.1f} GiB of GPU memory after losing their launcher: "
                               + ", ".join(f"pid {p} (rank {job.ranks[p]}, GPU {','.join(map(str, self.view.gpu_of.get(p, {})))})" for p in holding))
                inc.evidence = {"holders": {str(p): {"rank": job.ranks[p], "gpu_mem_bytes": sigs[p].gpu_mem if p in sigs else None,
                                                      "reason": self._orphan_reason(p)} for p in holding}}
                self.book.touch(inc, t)
            else:
                self.book.resolve(inc, t, "the orphaned processes are gone and their GPU memory is free")

    def _resolve_gone_jobs(self, t: float) -> None:
        """Every incident of a job whose processes are all gone is over."""
        for (job_id, _family), inc in list(self.book.open.items()):
            if job_id.startswith("gpu:"):
                continue
            job = self.job_defs.get(job_id)
            pids = job.pids if job is not None else inc.pids
            alive = [p for p in pids if (h := self.view.procs.get(p)) is not None and h.gone_at is None
                     and (lp := h.latest()) is not None and lp.state not in ("Z", "X")]
            if not alive:
                self.book.resolve(inc, t, "the job's processes are gone")

    def _unattributed_memory(self, t: float) -> None:
        """GPU memory that no visible process holds (a process in another PID namespace, or a
        leaked context) for a while."""
        th = self.th
        for idx, dq in self.view.gpus.items():
            if not dq:
                continue
            tt, g = dq[-1]
            if g.mem_used is None:
                continue
            held = sum(p.used or 0 for p in g.procs)
            base = min(self.view.gpu_baseline.get(idx, g.mem_used), 1 * GiB)
            extra = g.mem_used - held - base
            key = f"gpu:{idx}"
            inc = self.book.get(key, "orphan")
            if extra >= th.unattributed_gpu_bytes:
                since = self._unattributed.setdefault(idx, t)
                if t - since >= th.unattributed_gpu_s and inc is None:
                    inc = self.book.open_incident("orphaned_gpu_memory", key, t)
                    inc.summary = (f"GPU {idx} has {extra / GiB:.1f} GiB in use that no visible process holds "
                                   f"(used {g.mem_used / GiB:.1f} GiB, processes {held / GiB:.1f} GiB): a process in "
                                   "another PID namespace, or leaked memory. Check `nvidia-smi` on the host.")
                    inc.evidence = {"gpu": idx, "mem_used": g.mem_used, "held_by_processes": held}
            else:
                self._unattributed.pop(idx, None)
                if inc is not None:
                    self.book.resolve(inc, t, "the memory was freed")

    # ------------------------------------------------------------------ requests

    def _ask_for_evidence(self, job: Job, js: _Job, live: list[int], quiet: float, t: float) -> None:
        th = self.th
        if not live:
            return
        if quiet < th.stack_quiet_s:
            js.stacks_asked = []
            js.native_asked = False
            return
        if all(self.procs[p].local == "busy" for p in live):
            return
        asked = js.stacks_asked
        if not asked or (len(asked) < 2 and t - asked[-1] >= th.stack_repeat_s) or t - asked[-1] >= 300:
            asked.append(t)
            self.requests.stacks.extend((p, False) for p in live)
        if js.hung and not js.native_asked:
            js.native_asked = True
            self.requests.stacks.extend((p, True) for p in live)
            self.requests.ras = True
            if js.fr_asked is None or t - js.fr_asked > 60:
                js.fr_asked = t
                self.requests.fr_dumps.extend(live)

    def take_requests(self) -> Requests:
        r, self.requests = self.requests, Requests()
        return r

    # ------------------------------------------------------------------ views

    def process_states(self) -> list[dict[str, Any]]:
        out = []
        for job in self.job_defs.values():
            for pid in job.pids:
                p = self.procs.get(pid)
                if p is None or p.state is None:
                    continue
                s = self.signals.get(pid)
                out.append({"pid": pid, "rank": job.ranks[pid], "job": job.id, "state": p.state,
                            "since": round(p.since, 3), "reason": p.reason,
                            "gpus": s.gpu_indexes if s else [], "gpu_mem_bytes": s.gpu_mem if s else None,
                            "cpu_cores": round(s.cpu_cores, 2) if s and s.cpu_cores is not None else None,
                            "last_progress": round(p.last_progress, 3) if p.last_progress else None,
                            "last_progress_why": p.progress_why})
        return out

    def job_states(self) -> list[dict[str, Any]]:
        out = []
        for job in self.job_defs.values():
            states = [self.procs[p].state for p in job.pids if p in self.procs and self.procs[p].state not in (None, "gone")]
            if not states:
                continue
            js = self.jobs.get(job.id)
            state = "hung" if js and js.hung else "orphaned" if "orphaned" in states else \
                max(states, key=lambda s: STATES.index(s) if s in STATES else -1)
            lasts = [x for p in job.pids if p in self.procs and (x := self.procs[p].last_progress)]
            out.append({"job": job.id, "name": job.name, "state": state, "ranks": {str(r): p for p, r in job.ranks.items()},
                        "world_size": job.world_size, "launcher": job.launcher,
                        "last_progress": round(max(lasts), 3) if lasts else None})
        return out
