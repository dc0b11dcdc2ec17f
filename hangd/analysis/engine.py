"""The analysis: snapshots in; process states with reasons, incidents with culprits out.

``Analyzer.step(snapshot)`` runs the stages in order and holds the views; the stages live in
their own modules:

    identity   which processes form which job, and each one's rank
    progress   which signal moved, and whose it is
    history    what the facts of setting up need from earlier ticks (quiet since, working since,
               GPU memory marks), kept before the facts read them
    facts      what each record of evidence says (pure functions, one module a family)
    rankstate  the reading and the state: tables of those facts
    detectors  one module per incident family
    report     the evidence a person reads

Daemon, replay, record, status and the server use only the public surface below: ``step``,
``take_requests``, ``drain``, ``processes``, ``jobs``, ``gpus``, ``incident``, ``incidents``, ``ack``.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import replace
from typing import Any

from hangd.analysis import (
    asks,
    frjobs,
    gather,
    hardware,
    history,
    otherend,
    rankstate,
    report,
    stackcat,
)
from hangd.analysis.detectors import Env, exits, hang, orphan, straggler
from hangd.analysis.facts import Context
from hangd.analysis.facts import stack as stack_facts
from hangd.analysis.facts.waits import REQUEST_WCHANS, same_wait_point
from hangd.analysis.identity import Job, group_jobs
from hangd.analysis.model import (
    LOCAL_TO_STATE,
    SEVERITY_ORDER,
    STATES,
    Local,
    Reading,
    State,
    StateChange,
)
from hangd.analysis.nodeview import NodeView, ProcHistory
from hangd.analysis.progress import ProgressBook
from hangd.analysis.rankstate import classify
from hangd.analysis.signals import GpuSignals, ProcSignals, proc_signals
from hangd.analysis.thresholds import Thresholds
from hangd.analysis.views import JobTrack, JobView, ProcTrack
from hangd.evidence import Requests, decode_evidence
from hangd.incidents import Incident, IncidentBook
from hangd.snapshot import GpuSample, RemoteDump, RemoteRank, Snapshot

log = logging.getLogger("hangd.analysis")

__all__ = ["STATES", "Analyzer", "REQUEST_WCHANS", "Requests", "StateChange"]


class Analyzer:
    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.th = thresholds or Thresholds()
        self.view = NodeView(self.th)
        self.book = IncidentBook(keep_resolved=self.th.max_incidents_in_memory, refresh_s=self.th.incident_refresh_s,
                                 timeline_kept=self.th.timeline_kept)
        self.progress = ProgressBook(self.th)
        self.tracks: dict[int, ProcTrack] = {}
        self.flight = frjobs.Flight(say=self._finding)  # the flight-recorder stage's records
        self.job_tracks: dict[str, JobTrack] = self.flight.tracks
        self.job_defs: dict[str, Job] = {}
        self.changes: deque[StateChange] = deque(maxlen=self.th.max_changes_in_memory)
        self.findings: deque[dict[str, Any]] = deque(maxlen=self.th.max_findings_in_memory)
        self.requests = Requests()
        self.capturing_jobs: set[str] = set()  # jobs that may be capturing CUDA graphs (asks.capturing): no dumps
        self.signals: dict[int, ProcSignals] = {}
        self.dropped: dict[str, int] = {"changes": 0, "findings": 0, "processes": 0, "jobs": 0}
        self._unattributed: dict[int, float] = {}
        # the ranks other nodes report for the jobs that span nodes (the newest a snapshot brought)
        self.remote: dict[str, list[RemoteRank]] = {}
        self.node_name: str | None = None  # this node's name in a fleet (it names ranks "rank 3 on node-b")
        self.last_t = 0.0  # the time of the newest snapshot
        self.env = Env(self.th, self.view, self.tracks, self.progress, self.book, node=lambda: self.node_name,
                       requests=self.requests, capturing_jobs=self.capturing_jobs)
        self.book.who_of = lambda job: j.who if (j := self.job_defs.get(job)) is not None else None

    # ------------------------------------------------------------------ public surface

    @property
    def unreadable(self) -> int:
        """Evidence files (flight-recorder dumps) that could not be decoded."""
        return self.flight.unreadable

    @property
    def remote_dumps(self) -> dict[str, dict[tuple[str, int], RemoteDump]]:
        """The flight-recorder dumps other nodes wrote of the ranks of jobs that span nodes."""
        return self.flight.remote

    def step(self, snap: Snapshot) -> list[StateChange]:
        """Feed one snapshot; the state changes it caused."""
        decode_evidence(snap)  # sources decode already; a hand-made snapshot may not have
        self.view.feed(snap)
        self.last_t = snap.t
        if snap.node is not None:
            self.node_name = snap.node
        if snap.remote is not None:
            self.remote = {}
            for rr in snap.remote:
                self.remote.setdefault(rr.job, []).append(rr)
        t = snap.t
        fr_jobs = frjobs.remote_dumps_arrived(self.flight, snap.remote_dumps) if snap.remote_dumps is not None else set()
        for pid in self.view.new_stacks:
            self._stack_arrived(pid, t)
        if snap.fr_dumps:
            fr_jobs |= frjobs.fr_arrived(self.env, self.flight, self.job_defs, snap, t)
        for job_id in sorted(fr_jobs):
            frjobs.fr_analyze(self.env, self.flight, self.job_defs, job_id, t)
        for r in snap.ras:
            frjobs.ras_arrived(self.env, self.flight, self.job_defs, r, t)
        if not snap.procs:
            return []
        out = self._evaluate(t)
        for c in out:
            if len(self.changes) == self.changes.maxlen:
                self.dropped["changes"] += 1
            self.changes.append(c)
        self._forget(t)
        return out

    feed = step  # the older name

    def take_requests(self) -> Requests:
        r, self.requests = self.requests, Requests()
        self.env.requests = self.requests
        return r

    def take_fr_dumps(self) -> dict[tuple[str, int], tuple[float, Any]]:
        """The flight-recorder dumps read since the last call of ranks of jobs that span nodes,
        for a shared store: (job, rank) -> (when read, Dump); only a rank's newest."""
        out, self.flight.out = self.flight.out, {}
        return out

    def drain(self) -> list[Incident]:
        """Incidents opened, changed or resolved since the last drain."""
        return self.book.drain()

    def incident(self, incident_id: int) -> Incident | None:
        return self.book.find(incident_id)

    def incidents(self, open_only: bool = False) -> list[Incident]:
        """Open ones (including those adopted from before a restart), or all still in memory."""
        if open_only:
            return [*self.book.open.values(), *(i for i in self.book.adopted.values() if i not in self.book.open.values())]
        return self.book.all

    def ack(self, incident_id: int) -> Incident | None:
        return self.book.ack(incident_id)

    def opened_counts(self) -> dict[str, int]:
        """Incidents opened since start, by kind."""
        return dict(self.book.opened_by_kind)

    def adopt(self, records: list[dict[str, Any]], next_id: int) -> None:
        """Incidents still open in the store from before a restart: the same episode continues
        under its id if the analysis sees it again."""
        for d in records:
            self.book.adopt(d)
        self.book.next_id = max(self.book.next_id, next_id)

    def resolve_adopted(self, t: float) -> None:
        """Adopted incidents whose job is not here (or no longer hung) are over."""
        for key, inc in list(self.book.adopted.items()):
            if inc.job in self.job_defs and inc.family == hang.FAMILY:
                continue  # the job is still here: the analysis will re-open or leave it
            self.book.adopted.pop(key)
            self.book.open[key] = inc
            self.book.resolve(inc, t, "not seen again after hangd restarted: the job is gone or recovered")

    def has_adopted(self) -> bool:
        return bool(self.book.adopted)

    def forgotten(self) -> dict[str, int]:
        """Counts of what was dropped from memory to keep it bounded (the store keeps history)."""
        return {**self.dropped, "incidents": self.book.dropped}

    def job_pids(self) -> list[int]:
        return [p for j in self.job_defs.values() for p in j.pids]

    def dumpable_pids(self) -> list[int]:
        """``job_pids`` less those of jobs that may be capturing CUDA graphs at the last tick."""
        return [p for j in self.job_defs.values() if j.id not in self.capturing_jobs for p in j.pids]

    def processes(self) -> list[dict[str, Any]]:
        out = []
        for job in self.job_defs.values():
            for pid in job.pids:
                p = self.tracks.get(pid)
                if p is None or p.state is None:
                    continue
                s = self.signals.get(pid)
                pr = self.progress.of(pid)
                # a rank of a job that spans nodes also says what the other nodes diagnose with
                fleet = {"world_size": job.world_size, "waits": p.reading.local.waits_for_peer,
                         "local": str(p.reading.local), "reading": p.reading.why} if job.spans_nodes else {}
                out.append({**fleet, "pid": pid, "rank": job.ranks[pid], "rank_from": job.rank_source.get(pid), "job": job.id,
                            "state": str(p.state), "since": round(p.since, 3), "reason": p.reason,
                            "gpus": s.gpu_indexes if s else [],
                            # missing is not zero: without any GPU reading, GPU memory is unknown
                            "gpu_mem_bytes": s.gpu_mem if s and self.view.gpus else None,
                            "cpu_cores": round(s.cpu_cores, 2) if s and s.cpu_cores is not None else None,
                            "last_progress": round(pr.last, 3) if pr.last else None,
                            "last_progress_why": pr.why, "moved": dict(p.moved), "command": self._command(pid),
                            "log_grew_at": s.log_grew_at if s else None})
        return out

    process_states = processes  # the older name

    def job_nodes(self) -> dict[str, dict[str, tuple[float, int]]]:
        """Per job that spans nodes, in a fleet: every node that reports it -> (its last report,
        its ranks of the job). This node's last report is its last snapshot."""
        out: dict[str, dict[str, tuple[float, int]]] = {}
        if self.node_name is None:
            return out
        for job in self.job_defs.values():
            if not job.spans_nodes:
                continue
            nodes = out[job.id] = {self.node_name: (self.last_t, len(job.ranks))}
            for r in self.remote.get(job.id, []):
                nodes[r.node] = (r.reported_at, nodes.get(r.node, (0.0, 0))[1] + 1)
        return out

    def spanning_jobs(self) -> set[str]:
        """The jobs (keys) with ranks on other nodes."""
        return {j.id for j in self.job_defs.values() if j.spans_nodes}

    def cmdline(self, pid: int) -> list[str] | None:
        """The command line of a watched process (secrets already redacted at the source)."""
        h = self.view.procs.get(pid)
        return list(h.info.cmdline) if h is not None and h.info is not None and h.info.cmdline else None

    def _command(self, pid: int) -> str | None:
        h = self.view.procs.get(pid)
        if h is None or h.info is None or not h.info.cmdline:
            return None
        return " ".join(h.info.cmdline)[:300]

    def jobs(self) -> list[dict[str, Any]]:
        out = []
        for job in self.job_defs.values():
            states = [self.tracks[p].state for p in job.pids if p in self.tracks and self.tracks[p].state not in (None, State.GONE)]
            if not states:
                continue
            tr = self.job_tracks.get(job.id)
            # the most severe of its ranks' states (orphaned ranks above all), or hung while the job is
            state = State.HUNG if tr and tr.hung else max(states, key=lambda s: SEVERITY_ORDER[State(s)])  # type: ignore[arg-type]
            lasts = [x for p in job.pids if (x := self.progress.of(p).last)]
            out.append({"job": job.id, "name": job.name, "state": str(state), "ranks": {str(r): p for p, r in job.ranks.items()},
                        "rank_from": {str(r): job.rank_source.get(p) for p, r in job.ranks.items()},
                        "identity": job.key_parts, "world_size": job.world_size, "launcher": job.launcher,
                        "last_progress": round(max(lasts), 3) if lasts else None,
                        # only for a job with ranks on other nodes: a single node's views stay as they were
                        **({"spans_nodes": job.spans_nodes} if job.spans_nodes else {}),
                        **({"who": job.who} if job.who else {})})  # owner, Slurm job, pod: where known
        return out

    job_states = jobs  # the older name

    def latest_gpus(self) -> dict[int, GpuSample]:
        """The newest NVML reading of every GPU."""
        return {idx: dq[-1][1] for idx, dq in self.view.gpus.items() if dq}

    def gpus(self) -> list[dict[str, Any]]:
        out = []
        for idx, dq in sorted(self.view.gpus.items()):
            if not dq:
                continue
            g = dq[-1][1]
            out.append({"index": idx, "uuid": g.uuid, "name": g.name, "util_gpu": g.util_gpu, "util_mem": g.util_mem,
                        "mem_used": g.mem_used, "mem_total": g.mem_total,
                        "power_w": g.power_w, "temp_c": g.temp_c,
                        "sm_clock": g.sm_clock, "gpm": g.gpm, "processes": [{"pid": p.pid, "used": p.used} for p in g.procs],
                        **hardware.gpu_record(self.view.hw, idx, g, self.view.t)})
        return out

    # ------------------------------------------------------------------ evidence arriving

    def _track(self, pid: int) -> ProcTrack:
        return self.env.track(pid)

    def _stack_arrived(self, pid: int, t: float) -> None:
        h = self.view.procs[pid]
        good = [s for s in h.stacks[-1][1] if s.threads]
        if not good:
            return
        p = self._track(pid)
        v = stackcat.classify(good)
        py = [s for s in good if not s.native]
        sig = max((stackcat.signature(s) for s in py), key=len) if py else ()
        again = p.between_n + 1 if p.between_sig == sig else 1
        if not v.known and _polls(p, self.signals.get(pid), self.th) and p.stack_sig and sig \
                and _same_loop(p.stack_sig, sig) and again < self.th.between_captures:
            # a server's loop caught between two of its waits for requests (broadcasting the empty
            # batch of its poll), on little CPU: still the loop that waits for requests, gone nowhere.
            # Caught at exactly that place again and again (another capture is asked for at once),
            # it is not between two waits: it stays there (a request it took, stuck in its handler)
            p.verdict_t, p.verdict_wchan, p.between_sig, p.between_n = t, _wait_point(h), sig, again
            self.requests.stacks.append((pid, False))
            return
        p.between_sig, p.between_n = (), 0
        # moved: the calls differ, not only the line of the innermost frame (a loop spinning in one
        # function shows a new line at each capture and goes nowhere)
        if p.stack_sig and sig and _calls(sig) != _calls(p.stack_sig) and p.stack_sig_t is not None:
            # it moved some time after the earlier capture: credit that moment, not this one
            self.progress.credit(pid, p.stack_sig_t + 0.01, "its stack changed between two captures", strong=True)
        if sig:
            p.stack_sig, p.stack_sig_t = sig, t
        if v.known or p.verdict_t is None or t - p.verdict_t > self.th.window_s / 2:
            p.verdict, p.verdict_t = v, t
            p.verdict_wchan = _wait_point(h)
        if v.kind in stackcat.COMPILE_KINDS:
            p.compiled_at = t

    def _finding(self, d: dict[str, Any]) -> None:
        if len(self.findings) == self.findings.maxlen:
            self.dropped["findings"] += 1
        self.findings.append(d)

    def _context(self, pid: int, s: ProcSignals, t: float, exception_as_it_stopped: bool = False) -> Context:
        """What the engine knows of a process beyond its signals. A stack describes the process
        only while it stays where it was: no progress since, blocked at the same kernel wait point
        (a sleeping straggler caught once inside a fast collective is not waiting in it)."""
        th = self.th
        p = self._track(pid)
        pr = self.progress.of(pid)
        # a stack that shows work (compiling, loading, capturing) describes it while that work goes
        # on, wherever in the kernel it is between two captures; a wait only at the same wait point
        # (and through the progress that work makes, until the next capture is due)
        if p.verdict.kind in stackcat.WORK_KINDS:
            fresh = p.verdict_t is not None and t - p.verdict_t <= th.cpu_stack_every_s
            if fresh and p.verdict.kind in stackcat.COMPILE_KINDS and p.verdict_t is not None:
                # a compile ends without a stack saying so: once nothing shows it going on (see
                # stack_facts.compile_goes_on) the stack of the compile no longer describes it
                fresh = t - p.verdict_t <= th.window_s or stack_facts.compile_goes_on(s, th)
            if fresh and p.verdict.kind == "computing":
                # a forward pass or a step goes on while its CPU or its GPU works: asleep with both
                # still, the rank has moved on (into a wait no capture has shown yet)
                fresh = stack_facts.computing_goes_on(s, th)
        else:
            # a server's poll loop wakes at several wait points (its queue read's timeout, its
            # broadcast): on little CPU, its wait for requests holds wherever it is caught between
            fresh = p.verdict_t is not None and t - p.verdict_t <= th.verdict_fresh_s and \
                (pr.last_strong is None or pr.last_strong <= p.verdict_t + th.window_s) and \
                (_polls(p, s, th) or same_wait_point(p.verdict_wchan, s, th)) and \
                not _ran_since(p, s, t, th)
        p.other_end = otherend.other_end(self.view, pid)  # once a tick: gather reads it off the track
        # a stack in its own code (none of the compiler's frames) taken after its last compiling one
        out = p.verdict.kind not in stackcat.COMPILE_KINDS and p.verdict_t is not None and bool(p.stack_sig) and \
            p.stack_sig_t == p.verdict_t and t - p.verdict_t <= th.cpu_stack_every_s and p.compiled_at is not None \
            and p.verdict_t > p.compiled_at
        return Context(verdict=p.verdict if fresh else stackcat.UNKNOWN, progressed_recently=pr.recent(t, th.window_s),
                       progress_why=pr.why, other_end=p.other_end, out_of_compile=out,
                       exception_as_it_stopped=exception_as_it_stopped)

    def _last_wait(self, pid: int, s: ProcSignals, t: float) -> str | None:
        return self.env.last_wait(pid, s, t)

    def _evaluate(self, t: float) -> list[StateChange]:
        out: list[StateChange] = []
        self.job_defs = group_jobs(self.view, self.th, self._fr_ranks())
        for job in self.job_defs.values():
            out.extend(self._evaluate_job(job, t))
        orphan.unattributed(self.env, self._unattributed, t)
        self._resolve_gone_jobs(t)
        return out

    def _fr_ranks(self) -> dict[int, int]:
        return {pid: r for tr in self.job_tracks.values() for r, pid in tr.fr_pids.items()}

    def _evaluate_job(self, job: Job, t: float) -> list[StateChange]:
        th = self.th
        tr = self.job_tracks.setdefault(job.id, JobTrack())
        tr.last_seen = t
        live: list[int] = []
        for pid in job.pids:
            h = self.view.procs[pid]
            lp = h.latest()
            if h.gone_at is not None or lp is None or lp.state in ("Z", "X"):
                tr.exited.setdefault(pid, h.gone_at or h.zombie_since or t)
                continue
            live.append(pid)
        sigs: dict[int, ProcSignals] = {}
        for pid in live:
            s = sigs[pid] = proc_signals(self.view, pid, t, th)
            self.signals[pid] = s
            self.progress.observe(pid, s, t, self._last_wait(pid, s, t))
        last, last_strong = self.progress.job_last(live)
        # a queue read that a listener thread's requests would feed: unless an exception came as
        # the job went still (the thread whose result it waits for may be the one that died)
        queue_fed = any(stackcat.fed_from_outside(self._track(pid).verdict) for pid in live)
        died = queue_fed and last is not None and report.exception_as_it_stopped(self.view, job, last, th.window_s)
        ctxs = {pid: self._context(pid, sigs[pid], t, died) for pid in live}
        readings: dict[int, Reading] = {pid: classify(sigs[pid], ctxs[pid], th) for pid in live}
        _shared_spins(job, sigs, ctxs, readings, th)
        for pid, rd in readings.items():
            tp = self._track(pid)
            tp.reading, tp.job, tp.rank = rd, job.id, job.ranks.get(pid)
        if last is None:
            firsts = [self.view.procs[pid].first_seen for pid in live]
            last = min(firsts) if firsts else t
        jv = JobView(job=job, track=tr, t=t, live=live, sigs=sigs, readings=readings, quiet=t - last,
                     last_progress=last, last_strong=last_strong,
                     remote=self.remote.get(job.id, []) if job.spans_nodes else [], node_stale_s=th.node_stale_s)
        if live:
            # a rank on another node that progresses makes the job progress (ranks here may wait for it)
            remote_last = max((r.last_progress for r in jv.remote_fresh if r.last_progress is not None), default=None)
            if remote_last is not None and remote_last > jv.last_progress:
                jv.last_progress, jv.quiet = remote_last, max(0.0, t - remote_last)
        jv.idle = gather.idle_server(self.env, jv)
        gather.name_workers(self.env, jv)
        orphans = {pid for pid in live if orphan.is_orphaned(self.view, pid)}

        exited_inc = exits.step(self.env, jv)
        hang.step(self.env, jv, blocked_by_exit=exited_inc is not None or exits.pending(self.env, jv))
        straggler.track_episodes(self.env, jv)
        straggler.step(self.env, jv)
        orphan.step(self.env, jv, orphans)
        asks.ask_for_evidence(self.env, jv)
        return self._states(jv, orphans)

    def _states(self, jv: JobView, orphans: set[int]) -> list[StateChange]:
        """Each rank's reported state: its evidence record, decided by ``rankstate``'s table."""
        job, tr, t, live = jv.job, jv.track, jv.t, jv.live
        history.remember(self.env, jv)
        facts = gather.job_facts(self.env, jv)
        changes = []
        for pid in live:
            if jv.readings[pid].local == Local.ZOMBIE:
                continue
            loc = jv.readings[pid].local
            read_as = LOCAL_TO_STATE.get(loc) if loc in (Local.LOADING, Local.WRITING) else None
            p0 = self._track(pid)
            if p0.read_as[0] != read_as:
                p0.read_as = (read_as, t)
            ev = gather.evidence(self.env, pid, jv, facts, pid in orphans)
            d = rankstate.decide(ev)
            p = self._track(pid)
            p.started = p.started or ev.first_evidence or d.state not in (State.STARTING,)
            p.rule = d.rule
            # the record it was judged on, per source: moved or not, or unknown (and what moved)
            p.moved = {src: f"{m}: {ev.how[src]}" if src in ev.how and m == rankstate.Moved.YES else str(m)
                       for src, m in ev.progress.items()}
            ch = self._set_state(pid, job, d.state, d.reason, t, jv.sigs[pid])
            if ch is not None:
                changes.append(ch)
        for pid in list(tr.exited):
            p = self._track(pid)
            h = self.view.procs.get(pid)
            # gone, or a zombie its parent leaves unreaped (a launcher waiting on another rank first)
            if p.state is not None and p.state != State.GONE and h is not None and \
                    (h.gone_at is not None or h.zombie_since is not None and t - h.zombie_since >= self.th.dwell_s):
                p.state, p.since, p.pending = State.GONE, t, None
                changes.append(StateChange(t, pid, job.ranks.get(pid), job.id, State.GONE, "the process exited"
                                           + (" (a zombie, not yet reaped)" if h.gone_at is None else "")))
        return changes

    def _set_state(self, pid: int, job: Job, state: State, reason: str, t: float, s: ProcSignals) -> StateChange | None:
        p = self._track(pid)
        if state == p.state:
            p.pending = None
            p.reason = reason
            p.away.clear()
            return None
        p.away.append((t, state, reason))
        # hung is said at once (the incident says it too); orphaned holds for the dwell like the rest:
        # a job torn down rank by rank has its launcher gone a moment before its ranks
        immediate = p.state is None or state == State.HUNG or fresh_compile(p, state)
        if not immediate:
            if p.pending != state:
                p.pending, p.pending_since = state, t
                if p.state == State.STARTING and p.read_as[0] == state:
                    # setting up ended on evidence it had shown a while: that evidence has held since
                    p.pending_since = p.read_as[1]
            # idle waits longer (a rank just gone quiet may be in a wait its stack will show), unless
            # it waits for requests itself (accept, an event loop) or its job is an idle server (its
            # wait is known to be for one that does): that is what idle is
            serving = p.reading is not None and p.reading.local == Local.SERVING or p.rule == "idle_server"
            # ... and so does busy on nothing but a core in use after a state shown on evidence of
            # reads, a compile or a wait: a guess like idle (a loader that stops reading to spin in a
            # barrier's set-up, or in a loop of its own that never ends, burns a core too)
            guess = state == State.BUSY and p.reading is not None and p.reading.local == Local.CPU \
                and p.state in (State.LOADING, State.COMPILING, State.WAITING_PEER)
            held = t - p.pending_since >= (self.th.idle_dwell_s if (state == State.IDLE and not serving) or guess else self.th.dwell_s)
            if not held:
                # the readings flicker between other states (busy, quiet, a spin) and none holds the
                # dwell: once the old state has not been read for twice the dwell, the most frequent
                # of the new ones is said, not the old one that nothing shows any more
                if t - p.away[0][0] < 2 * self.th.dwell_s:
                    return None
                counts: dict[State, int] = {}
                for _, st, _ in p.away:
                    counts[st] = counts.get(st, 0) + 1
                state = max(counts, key=lambda st: (counts[st], st == state))
                reason = next(r for _, st, r in reversed(p.away) if st == state)
                if state == State.IDLE and t - p.away[0][0] < self.th.idle_dwell_s:
                    return None
        p.away.clear()
        p.state, p.since, p.reason, p.pending = state, t, reason, None
        p.shown.append((t, state, reason, p.reading.local))
        return StateChange(t, pid, job.ranks.get(pid), job.id, state, reason, {"signals": s.brief()})

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

    def _forget(self, t: float) -> None:
        """Bound memory: tracks of processes and jobs long gone go (the store keeps the history)."""
        th = self.th
        for pid in [p for p in self.tracks if p not in self.view.procs]:
            del self.tracks[pid]
            self.progress.forget(pid)
            self.signals.pop(pid, None)
            self.dropped["processes"] += 1
        for job_id in [j for j, tr in self.job_tracks.items()
                       if j not in self.job_defs and t - tr.last_seen > th.serve_job_quiet_s
                       and not any(k[0] == j for k in self.book.open)]:
            del self.job_tracks[job_id]
            self.dropped["jobs"] += 1
        for key in [k for k in self.flight.out if k[0] not in self.job_tracks]:
            del self.flight.out[key]


# Stack kinds of a wait that is not for a peer: one of its own job (stackcat.OWN_WAIT_KINDS), or a sleep
NOT_FOR_A_PEER = stackcat.OWN_WAIT_KINDS | {"sleeping", "request_wait"}


def _shared_spins(job: Job, sigs: dict[int, ProcSignals], ctxs: dict[int, Context],
                  readings: dict[int, Reading], th: Thresholds) -> None:
    """Ranks of one job on one GPU (two ranks sharing it, or a GPU a process hangd cannot see uses
    too) each read its spin, NVML's per-process samples telling none apart. The spin is not a rank's:
    - when its stack still describes it blocked in a wait of its own (an event, a lock, its
      workers, a sleep) or waiting for requests, while another on its GPU may be the one spinning
      (a rank in a collective by its stack, or spinning with no stack that places it in a wait of
      its own or a wait for requests, or a process hangd cannot see);
    - when it holds its CUDA context alone on that GPU: no NCCL communicator (whose buffers and
      kernels bring hundreds of MB more), so no collective kernel of its own; its CPU, its bytes
      and its stack say what it does."""
    may_spin = {pid for pid, c in ctxs.items() if c.verdict.kind == "collective"
                or (readings[pid].local == Local.SPINNING and c.verdict.kind not in NOT_FOR_A_PEER)}
    for pid, rd in list(readings.items()):
        s, v = sigs[pid], ctxs[pid].verdict
        if rd.local != Local.SPINNING or not s.gpu_shared:
            continue
        others = [o for o in may_spin if o != pid and set(sigs[o].gpu_indexes) & set(s.gpu_indexes)]
        # a process hangd cannot see may be the spinner, unless NVML's samples give it SM time itself
        hidden = s.gpu_unseen and not s.gpu_sm_named
        names = [*(f"rank {job.ranks[o]}" if o in job.ranks else f"pid {o}" for o in sorted(others)),
                 *(["a process hangd cannot see"] if hidden else [])]
        # "rank 1's collective"; "that of rank 1 or a process hangd cannot see"
        whose = f"{names[0]}'s collective" if len(names) == 1 and not hidden else \
            f"that of {' or '.join(names or ['another process'])}"
        if v.kind in NOT_FOR_A_PEER and names:
            readings[pid] = Reading(Local.SERVING if v.kind == "request_wait" else Local.QUIET,
                                    f"its stack is {v.why} ({v.frame}); the spin on its GPU is {whose}")
        elif 0 < s.gpu_mem <= th.context_gpu_bytes and not s.gpu_sm_named:
            rd2 = classify(replace(s, gpu=GpuSignals(util=0.0, has_gpm=s.gpu.has_gpm, power_w=s.gpu.power_w),
                                   gpu_work_at=None), ctxs[pid], th)
            readings[pid] = Reading(rd2.local, f"{rd2.why}; it holds its CUDA context alone on its GPU "
                                               f"({s.gpu_mem / 2**20:.0f} MiB): the spin on it is {whose}")


def fresh_compile(p: ProcTrack, state: State) -> bool:
    """A compile its stack shows, caught since its state was last said, is said at once: a capture
    is no flickering rate, and what it shows began before it was taken."""
    return state == State.COMPILING and p.verdict.kind in stackcat.COMPILE_KINDS and \
        p.verdict_t is not None and p.verdict_t > p.since


def _wait_point(h: ProcHistory) -> str | None:
    """Where in the kernel the process waits: the wchan of its newest reading outside a tracing
    stop (state ``t``: a stack capture or a debugger holds it a moment, and says nothing of the program)."""
    for _, ps in reversed(h.samples):
        if ps.state != "t":
            return ps.wchan
    return None


def _ran_since(p: ProcTrack, s: ProcSignals, t: float, th: Thresholds) -> bool:
    """On the CPU for a whole window since a stack that showed it asleep in a wait (the store, a
    lock, a queue, a sleep): a process asleep burns no core, so it has left that wait. (A wait in a
    collective may spin a core: CUDA's synchronize, a transport's busy poll.)"""
    return p.verdict.kind in stackcat.SLEEPING_KINDS and p.verdict_t is not None and \
        t - p.verdict_t >= th.window_s and (s.cpu_cores or 0) >= th.busy_cpu_cores and s.state == "R"


def _polls(p: ProcTrack, s: ProcSignals | None, th: Thresholds) -> bool:
    """Its stack last showed it waiting for requests, and it uses little CPU, or less than a core
    while its main thread keeps waking (its queue read's timeout): a server's poll loop. The CPU of
    that loop is mostly the broadcast of each empty batch, which spins until every rank took it:
    with eight ranks on the cores of one GPU, half a core, and it sleeps between. A loop on a whole
    core has left its polls for work of its own."""
    if p.verdict.kind != "request_wait":
        return False
    if s is None:
        return True
    cores = s.cpu_cores or 0
    return cores < th.busy_cpu_cores or (cores < th.poll_loop_cores and (s.wakes_per_s or 0) >= th.wake_per_s)


def _same_loop(old: tuple[str, ...], new: tuple[str, ...], depth: int = 3) -> bool:
    """Two stacks of one loop: the same calls from the outermost frame in to a function both are in
    (its lines aside), with at most ``depth`` frames of each beyond it (the wait of one, the next
    step of the other)."""
    a, b = [f.rsplit(":", 1)[0] for f in old], [f.rsplit(":", 1)[0] for f in new]
    shared = 0
    while shared < min(len(a), len(b)) and a[-1 - shared] == b[-1 - shared]:
        shared += 1
    return shared >= 1 and len(a) - shared <= depth and len(b) - shared <= depth


def _calls(sig: tuple[str, ...]) -> tuple[str, ...]:
    """A stack signature without the line of its innermost frame: where the calls are."""
    return (sig[0].rsplit(":", 1)[0], *sig[1:])

