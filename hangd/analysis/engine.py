"""The analysis: snapshots in; process states with reasons, incidents with culprits out.

``Analyzer.step(snapshot)`` runs the stages in order and holds the views; the stages live in
their own modules:

    identity   which processes form which job, and each one's rank
    progress   which signal moved, and whose it is
    local      what each process does on its own (a pure function)
    detectors  one module per incident family
    report     the evidence a person reads

Daemon, replay, record, status and the server use only the public surface below: ``step``,
``take_requests``, ``drain``, ``processes``, ``jobs``, ``gpus``, ``incident``, ``incidents``, ``ack``.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from hangd.analysis import hardware, local, rankstate, report, stackcat
from hangd.analysis.detectors import Env, exits, hang, mismatch, orphan, straggler
from hangd.analysis.identity import Job, group_jobs
from hangd.analysis.local import REQUEST_WCHANS, Context, classify
from hangd.analysis.model import (
    SEVERITY_ORDER,
    STATES,
    Local,
    Reading,
    State,
    StateChange,
)
from hangd.analysis.progress import ProgressBook
from hangd.analysis.signals import NodeView, ProcHistory, ProcSignals, Thresholds, proc_signals
from hangd.analysis.views import JobTrack, JobView, ProcTrack
from hangd.evidence import Requests, decode_evidence
from hangd.flightrec.analyze import Finding, FindingKind, analyze
from hangd.incidents import Incident, IncidentBook
from hangd.snapshot import GpuSample, RemoteDump, RemoteRank, Snapshot

log = logging.getLogger("hangd.analysis")

# Kernel wait points of a sleep in the process's own code (time.sleep), not a block on something.
SLEEP_WCHANS = ("hrtimer_nanosleep", "do_nanosleep", "clock_nanosleep", "common_nsleep")

__all__ = ["STATES", "Analyzer", "REQUEST_WCHANS", "Requests", "StateChange"]


class Analyzer:
    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.th = thresholds or Thresholds()
        self.view = NodeView(self.th)
        self.book = IncidentBook(keep_resolved=self.th.max_incidents_in_memory, refresh_s=self.th.incident_refresh_s,
                                 timeline_kept=self.th.timeline_kept)
        self.progress = ProgressBook(self.th)
        self.tracks: dict[int, ProcTrack] = {}
        self.job_tracks: dict[str, JobTrack] = {}
        self.job_defs: dict[str, Job] = {}
        self.changes: deque[StateChange] = deque(maxlen=self.th.max_changes_in_memory)
        self.findings: deque[dict[str, Any]] = deque(maxlen=self.th.max_findings_in_memory)
        self.requests = Requests()
        self.signals: dict[int, ProcSignals] = {}
        self.dropped: dict[str, int] = {"changes": 0, "findings": 0, "processes": 0, "jobs": 0}
        self.unreadable = 0  # evidence files (flight-recorder dumps) that could not be decoded
        self._unattributed: dict[int, float] = {}
        # the ranks other nodes report for the jobs that span nodes (the newest a snapshot brought)
        self.remote: dict[str, list[RemoteRank]] = {}
        # the flight-recorder dumps other nodes wrote of those jobs' ranks: job -> (node, rank) -> dump
        self.remote_dumps: dict[str, dict[tuple[str, int], RemoteDump]] = {}
        # dumps read here of ranks of jobs that span nodes, for the other nodes: (job, rank) -> (t, Dump)
        self._fr_out: dict[tuple[str, int], tuple[float, Any]] = {}
        self.node_name: str | None = None  # this node's name in a fleet (it names ranks "rank 3 on node-b")
        self.last_t = 0.0  # the time of the newest snapshot
        self.env = Env(self.th, self.view, self.tracks, self.progress, self.book, node=lambda: self.node_name)
        self.book.who_of = lambda job: j.who if (j := self.job_defs.get(job)) is not None else None

    # ------------------------------------------------------------------ public surface

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
        fr_jobs = self._remote_dumps_arrived(snap.remote_dumps) if snap.remote_dumps is not None else set()
        for pid in self.view.new_stacks:
            self._stack_arrived(pid, t)
        if snap.fr_dumps:
            fr_jobs |= self._fr_arrived(snap, t)
        for job_id in sorted(fr_jobs):
            self._fr_analyze(job_id, t)
        for r in snap.ras:
            self._ras_arrived(r, t)
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
        return r

    def take_fr_dumps(self) -> dict[tuple[str, int], tuple[float, Any]]:
        """The flight-recorder dumps read since the last call of ranks of jobs that span nodes,
        for a shared store: (job, rank) -> (when read, Dump); only a rank's newest."""
        out, self._fr_out = self._fr_out, {}
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
                            "last_progress_why": pr.why, "command": self._command(pid),
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
        p = self.tracks.get(pid)
        if p is None:
            p = self.tracks[pid] = ProcTrack()
        return p

    def _stack_arrived(self, pid: int, t: float) -> None:
        h = self.view.procs[pid]
        good = [s for s in h.stacks[-1][1] if s.threads]
        if not good:
            return
        p = self._track(pid)
        v = stackcat.classify(good)
        py = [s for s in good if not s.native]
        sig = max((stackcat.signature(s) for s in py), key=len) if py else ()
        if p.stack_sig and sig and sig != p.stack_sig and p.stack_sig_t is not None:
            # it moved some time after the earlier capture: credit that moment, not this one
            self.progress.credit(pid, p.stack_sig_t + 0.01, "its stack changed between two captures", strong=True)
        if sig:
            p.stack_sig, p.stack_sig_t = sig, t
        if v.known or p.verdict_t is None or t - p.verdict_t > self.th.window_s / 2:
            p.verdict, p.verdict_t = v, t
            p.verdict_wchan = _wait_point(h)

    def _fr_arrived(self, snap: Snapshot, t: float) -> set[str]:
        """Take in this node's dumps; the jobs that got one."""
        by_job: dict[str, list[int]] = {}
        for d in snap.fr_dumps:
            if d.error is not None:
                self.unreadable += 1
                self._finding({"t": round(t, 3), "kind": FindingKind.UNREADABLE, "pid": d.pid, "rank": d.rank,
                               "message": f"{d.path}: {d.error}", "source": d.source})
                continue
            dump = d.dump
            if dump is None:
                continue
            pid = d.pid
            # the job its process is a rank of (an exited rank stays in its job until it is forgotten),
            # else the dumps of one folder are one job
            job_id = next((j.id for j in self.job_defs.values() if pid in j.ranks), f"fr:{d.path.rsplit('/', 1)[0]}")
            tr = self.job_tracks.setdefault(job_id, JobTrack())
            rank = dump.rank if dump.rank is not None else d.rank
            if rank is None:
                continue
            prev = tr.fr.get(rank)
            if prev is not None and pid is not None:
                old_done = max((s.get("last_completed_collective") or 0 for s in prev[1].pg_status.values()), default=0)
                new_done = max((s.get("last_completed_collective") or 0 for s in dump.pg_status.values()), default=0)
                if new_done > old_done:
                    # credit when the newest completed collective was issued, not when the dump came
                    created = [e.time_created_ns for e in dump.entries if e.completed and e.time_created_ns]
                    at = min(t, max(created) / 1e9) if created else prev[0] + 0.01
                    self.progress.credit(pid, at, f"flight recorder: completed collectives {old_done} -> {new_done}",
                                         strong=True)
            tr.fr[rank] = (t, dump)
            if pid is not None:
                tr.fr_pids[rank] = pid
            by_job.setdefault(job_id, []).append(rank)
            job = self.job_defs.get(job_id)
            if self.node_name is not None and job is not None and job.spans_nodes:
                self._fr_out[(job_id, rank)] = (t, dump)
        return set(by_job)

    def _remote_dumps_arrived(self, dumps: list[RemoteDump]) -> set[str]:
        """Take in the other nodes' dumps; the jobs where one is new (or gone)."""
        new: dict[str, dict[tuple[str, int], RemoteDump]] = {}
        for d in dumps:
            new.setdefault(d.job, {})[(d.node, d.rank)] = d
        changed = set()
        for job_id in set(new) | set(self.remote_dumps):
            old = {k: d.read_at for k, d in self.remote_dumps.get(job_id, {}).items()}
            if old != {k: d.read_at for k, d in new.get(job_id, {}).items()}:
                changed.add(job_id)
        self.remote_dumps = new
        return changed

    def _fr_analyze(self, job_id: str, t: float) -> None:
        """Cross-rank findings over the job's dumps: this node's, and for a job that spans nodes
        the other nodes' too. A dump read longer ago than the node-stale window, or from a node
        that stopped reporting, is not compared (its rank would look behind the others): the node
        is said to be silent instead."""
        tr = self.job_tracks.setdefault(job_id, JobTrack())
        job = self.job_defs.get(job_id)
        spans = job is not None and job.spans_nodes
        # this node's dumps of an earlier hang are not compared with the other nodes' of this one
        dumps = {r: d for r, (at, d) in tr.fr.items() if not spans or at >= t - self.th.node_stale_s}
        if not dumps:
            return  # only the other nodes' dumps: their own nodes compare those
        nodes: dict[int, str] = {}
        silent: dict[str, list[RemoteDump]] = {}
        for (node, rank), rd in sorted(self.remote_dumps.get(job_id, {}).items()) if job and job.spans_nodes else []:
            if rank in dumps and rank not in nodes:
                continue  # this node's own dump of the rank
            if rd.reported_at < t - self.th.node_stale_s or rd.read_at < t - self.th.node_stale_s:
                silent.setdefault(node, []).append(rd)
                continue
            dumps[rank], nodes[rank] = rd.dump, node
        for node, rds in sorted(silent.items()):
            rd = rds[0]
            ranks = sorted(x.rank for x in rds)
            plural = "s" if len(ranks) > 1 else ""
            why = (f"no report since {report.clock(rd.reported_at)}" if rd.reported_at < t - self.th.node_stale_s
                   else f"its newest flight-recorder dump{plural} (read at {report.clock(max(x.read_at for x in rds))}) "
                        f"{'are' if plural else 'is'} older than {self.th.node_stale_s:.0f} s")
            self._fr_finding(job_id, tr, Finding(
                kind=FindingKind.NODE_SILENT, pg=None, seq=None, op=None, ranks=ranks, nodes={r: node for r in ranks},
                message=f"{node}: {why}; the flight-recorder entries of its rank{plural} {', '.join(map(str, ranks))} "
                        "are not compared"), t)
        if len(dumps) < 2:
            return
        for f in analyze(list(dumps.values()), nodes=nodes):
            self._fr_finding(job_id, tr, f, t)

    def _fr_finding(self, job_id: str, tr: JobTrack, f: Finding, t: float) -> None:
        key = _fr_key(f)
        wider = None
        if key in tr.fr_keys:
            # the same finding over more ranks (the other nodes' dumps came after this node's own)
            # takes the place of the narrower one; otherwise it is said once
            wider = next((i for i, x in enumerate(tr.findings) if _fr_key(x) == key and _fr_width(x) < _fr_width(f)), None)
            if wider is None:
                return
        if f.kind in (FindingKind.MISSING_RANK, FindingKind.STUCK) and self._job_progressing(job_id, t):
            return  # a dump of a job that still progresses catches collectives in flight
        tr.fr_keys.add(key)
        f.source = "flight_recorder"
        if wider is None:
            tr.findings.append(f)
        else:
            tr.findings[wider] = f
        self._finding({"t": round(t, 3), "job": job_id, **f.to_dict()})
        if f.kind in mismatch.KINDS:
            mismatch.step(self.env, job_id, self.job_defs.get(job_id), tr, f, t, wider=wider is not None)
        inc = self.book.get(job_id, hang.FAMILY)
        if inc is not None:
            inc.findings = [x.to_dict() for x in tr.findings]
            inc.evidence["flight_recorder"] = inc.findings
            self.book.touch(inc, t, "flight-recorder findings attached")

    def _ras_arrived(self, r: Any, t: float) -> None:
        """NCCL RAS's view (which rank launched fewer operations, which are missing), attached to
        the open hang incident of the job whose processes it names."""
        st = r.status
        if st is None:
            return
        d = {"t": round(t, 3), "kind": "nccl_ras", "source": "nccl_ras", **st.to_dict()}
        self._finding(d)
        pids = st.pids()
        for (_job, family), inc in self.book.open.items():
            if family == hang.FAMILY and pids & set(inc.pids):
                inc.evidence["nccl_ras"] = d
                behind = st.behind()
                note = ("NCCL RAS: " + "; ".join(f"rank {x['rank']} (pid {x['pid']}) launched up to {st.op or 'operation'} "
                                                  f"#{x['op']}" for x in sorted(st.launched, key=lambda x: x["rank"])))
                if behind:
                    inc.findings.append({"kind": "ras_behind", "source": "nccl_ras", "ranks": [x["rank"] for x in behind],
                                         "pids": [x["pid"] for x in behind], "message": note})
                self.book.touch(inc, t, note)

    def _finding(self, d: dict[str, Any]) -> None:
        if len(self.findings) == self.findings.maxlen:
            self.dropped["findings"] += 1
        self.findings.append(d)

    def _job_progressing(self, job_id: str, t: float) -> bool:
        job = self.job_defs.get(job_id)
        if job is None:
            return False
        _, strong = self.progress.job_last(job.pids)
        return strong is not None and strong >= t - self.th.stack_quiet_s

    # ------------------------------------------------------------------ per tick

    def _context(self, pid: int, s: ProcSignals, t: float) -> Context:
        """What the engine knows of a process beyond its signals. A stack describes the process
        only while it stays where it was: no progress since, blocked at the same kernel wait point
        (a sleeping straggler caught once inside a fast collective is not waiting in it)."""
        th = self.th
        p = self._track(pid)
        pr = self.progress.of(pid)
        fresh = p.verdict_t is not None and t - p.verdict_t <= th.verdict_fresh_s and \
            (pr.last_strong is None or pr.last_strong <= p.verdict_t + th.window_s) and \
            _same_wait_point(p.verdict_wchan, s)
        return Context(verdict=p.verdict if fresh else stackcat.UNKNOWN, progressed_recently=pr.recent(t, th.window_s),
                       progress_why=pr.why)

    def _last_wait(self, pid: int, s: ProcSignals, t: float) -> str | None:
        """The kind of wait its last stack showed, while it stays at the same kernel wait point."""
        p = self._track(pid)
        if p.verdict_t is None or t - p.verdict_t > self.th.verdict_known_s:
            return None
        if not _same_wait_point(p.verdict_wchan, s):
            return None
        return p.verdict.kind

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
        readings: dict[int, Reading] = {pid: classify(sigs[pid], self._context(pid, sigs[pid], t), th) for pid in live}
        for pid, rd in readings.items():
            tp = self._track(pid)
            tp.reading, tp.job, tp.rank = rd, job.id, job.ranks.get(pid)
        last, last_strong = self.progress.job_last(live)
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
        orphans = {pid for pid in live if orphan.is_orphaned(self.view, pid)}

        exited_inc = exits.step(self.env, jv)
        hang.step(self.env, jv, blocked_by_exit=exited_inc is not None or exits.pending(self.env, jv))
        straggler.track_episodes(self.env, jv)
        straggler.step(self.env, jv)
        orphan.step(self.env, jv, orphans)
        self._ask_for_evidence(jv)
        return self._states(jv, orphans)

    def _states(self, jv: JobView, orphans: set[int]) -> list[StateChange]:
        """Each rank's reported state: its evidence record, decided by ``rankstate``'s table."""
        job, tr, t, live = jv.job, jv.track, jv.t, jv.live
        facts = self._job_facts(jv)
        changes = []
        for pid in live:
            if jv.readings[pid].local == Local.ZOMBIE:
                continue
            ev = self._evidence(pid, jv, facts, pid in orphans)
            d = rankstate.decide(ev)
            p = self._track(pid)
            p.started = p.started or ev.first_evidence or d.state not in (State.STARTING,)
            p.rule = d.rule
            ch = self._set_state(pid, job, d.state, d.reason, t, jv.sigs[pid])
            if ch is not None:
                changes.append(ch)
        for pid in list(tr.exited):
            p = self._track(pid)
            h = self.view.procs.get(pid)
            if p.state is not None and p.state != State.GONE and h is not None and h.gone_at is not None:
                p.state, p.since, p.pending = State.GONE, t, None
                changes.append(StateChange(t, pid, job.ranks.get(pid), job.id, State.GONE, "the process exited"))
        return changes

    def _job_facts(self, jv: JobView) -> dict[str, Any]:
        """What the job says at this tick, the same for each of its ranks."""
        th = self.th
        job, tr, t = jv.job, jv.track, jv.t
        waiting, serving = jv.waiting, jv.serving
        hinc = self.book.get(job.id, hang.FAMILY)
        hung_why = ""
        hung_ref = f" (incident #{hinc.id} {hinc.kind})" if hinc else ""
        if tr.hung:
            hung_why = f"job hung: no rank has progressed for {jv.quiet:.0f} s"
        exited = hinc is not None and hinc.kind == "rank_exited" and not tr.hung
        if exited:
            assert hinc is not None
            hung_why = f"job hung: rank {', '.join(map(str, hinc.culprit_ranks))} exited and the others wait for it"
        idle, idle_why = self._idle_server(jv)
        # a pattern: at least two earlier waits in the window (one earlier blip is not one)
        recurring = tr.episode is not None and sum(
            1 for tt, c in tr.episodes
            if tr.episode_start - th.straggler_window_s <= tt < tr.episode_start - 0.5 and c == tr.episode) >= th.straggler_recurring
        # a rank the waiting ones wait for is working: they wait for a peer that works
        peer_works = any((x := self.progress.of(o).last) is not None and x > tr.episode_start
                         and t - x <= th.progress_recent_s for o in jv.live if o not in waiting)
        return {"hung": tr.hung, "exited": exited, "hung_why": hung_why, "hung_ref": hung_ref, "idle": idle, "idle_why": idle_why,
                # a wait read off the GPU may be a blip; any wait while nothing moves may be a hang in
                # the making; a wait for a peer that works is waiting_peer at once
                "hold": bool(waiting) and not recurring and (
                    (bool(jv.spinning) and t - tr.episode_start < (th.hang_gpu_s if not peer_works else 2 * th.dwell_s))
                    or (not peer_works and jv.quiet < 2 * th.hang_host_s)),
                "waiting": waiting, "serving": serving}

    def _idle_server(self, jv: JobView) -> tuple[bool, str]:
        """An idle server: ranks wait for one that waits for requests from outside the job, or the
        ranks' collectives keep completing while none of them works (a scheduler polling an empty
        queue and broadcasting empty batches many times a second)."""
        job, live, t = jv.job, jv.live, jv.t
        waiting, serving = jv.waiting, jv.serving
        others = set(live) - waiting
        if waiting and others and others <= serving:
            coord = ", ".join(str(job.ranks[o]) for o in jv.by_rank(serving))
            return True, f"idle server: waits for rank {coord}, which waits for requests"
        if not waiting or not others:
            return False, ""
        working = (Local.BUSY, Local.LOADING, Local.WRITING, Local.COMPILING, Local.GRAPH_CAPTURE, Local.STOPPED,
                   Local.WORKER_WAIT, Local.IO_WAIT)
        if any(jv.readings[p].local in working for p in live):
            return False, ""
        if jv.last_strong is not None and t - jv.last_strong <= self.th.stack_quiet_s:
            return False, ""  # something does work: the waits are for it
        completing = [p for p in waiting if self._collectives_complete(p, jv)]
        if not completing:
            return False, ""
        coord = ", ".join(str(job.ranks[o]) for o in jv.by_rank(others))
        return True, (f"idle server: the collectives with rank {coord} keep completing "
                      f"({jv.sigs[completing[0]].wakes_per_s or 0:.0f} a second) and no rank works")

    def _collectives_complete(self, pid: int, jv: JobView) -> bool:
        """Blocked in a collective whose main thread keeps waking: the collectives complete."""
        s = jv.sigs[pid]
        return self._last_wait(pid, s, jv.t) == "collective" and (s.wakes_per_s or 0) >= self.th.wake_per_s

    def _evidence(self, pid: int, jv: JobView, facts: dict[str, Any], orphaned: bool) -> rankstate.Evidence:
        """The record ``rankstate.decide`` judges: per source whether the rank moved, what it
        waits on, what its job says."""
        job, t = jv.job, jv.t
        s, rd, p = jv.sigs[pid], jv.readings[pid], self._track(pid)
        waiting, serving = facts["waiting"], facts["serving"]
        progress, how = self._progress_record(pid, s, t)
        waits_on, detail = self._waits_on(pid, jv)
        loc = rd.local
        peers = [w for w in waiting if w != pid]
        peers_wait = ", ".join(str(job.ranks[w]) for w in jv.by_rank(peers)) \
            if peers and pid not in waiting and pid not in serving else ""
        it_waits_for = ", ".join(str(job.ranks[o]) for o in jv.by_rank([o for o in jv.live if o != pid and o not in waiting])) \
            if loc.waits_for_peer else ""
        worker_stuck = loc == Local.WORKER_WAIT and progress.get("children") != rankstate.Moved.YES
        job_hung = facts["hung"] or (facts["exited"] and loc not in (Local.BUSY, Local.LOADING, Local.WRITING, Local.COMPILING))
        why = rd.why + (f": {detail}" if detail and loc == Local.WORKER_WAIT else "")
        return rankstate.Evidence(
            local=loc, why=why, progress=progress, how=how, waits_on=waits_on, waits_detail=detail,
            started=p.started, first_evidence=self._first_evidence(pid, jv), previous=p.state, why_previous=p.reason,
            orphaned=orphaned, orphan_why=orphan.reason(self.view, pid) if orphaned else "",
            job_hung=job_hung, hung_why=facts["hung_why"], hung_ref=facts["hung_ref"], age_s=s.age_s,
            idle_server=facts["idle"] and not worker_stuck, idle_why=facts["idle_why"],
            hold=facts["hold"], peers_wait_for_it=peers_wait, it_waits_for=it_waits_for)

    def _progress_record(self, pid: int, s: ProcSignals, t: float) -> tuple[dict[str, rankstate.Moved], dict[str, str]]:
        th = self.th
        M = rankstate.Moved
        out: dict[str, rankstate.Moved] = {}
        how: dict[str, str] = {}

        def put(src: str, known: bool, moved: bool, words: str = "") -> None:
            out[src] = M.UNKNOWN if not known else (M.YES if moved else M.NO)
            if moved and words:
                how[src] = words

        g = s.gpu
        put("gpu_work", bool(s.gpu_indexes) and g.util is not None, g.works(th), "its GPU works")
        put("cpu_own_code", s.cpu_cores is not None, (s.cpu_cores or 0) >= th.busy_cpu_cores,
            f"on CPU ({s.cpu_cores or 0:.1f} cores)")
        put("read", s.in_long_per_s is not None, local.moves(s, th, "in"),
            f"read {(s.in_long_per_s or 0) / 1e6:.0f} MB/s ({s.in_counter})")
        put("write", s.out_long_per_s is not None, local.moves(s, th, "out"),
            f"wrote {(s.out_long_per_s or 0) / 1e6:.0f} MB/s ({s.out_counter})")
        put("log", True, s.log_grew_at is not None and t - s.log_grew_at <= th.window_s, "wrote to its log")
        put("collectives", s.wakes_per_s is not None, self._last_wait(pid, s, t) == "collective"
            and (s.wakes_per_s or 0) >= th.wake_per_s, "its collectives complete")
        p = self._track(pid)
        put("stack", p.stack_sig_t is not None, bool(p.stack_sig_t and self.progress.of(pid).why.startswith("its stack")
                                                     and t - (self.progress.of(pid).last or 0) <= th.window_s),
            "its stack changed")
        kids = self._children(pid)
        put("children", bool(kids), any(self._child_works(c, t) for c in kids), "its workers work")
        return out, how

    def _children(self, pid: int) -> list[int]:
        """Live processes it started (DataLoader workers, pool processes, subprocesses)."""
        return [c for c, h in self.view.procs.items()
                if h.gone_at is None and (lp := h.latest()) is not None and lp.ppid == pid and lp.state not in ("Z", "X")]

    def _child_works(self, pid: int, t: float) -> bool:
        win = self.view.proc_window(pid, t, self.th.window_s)
        if len(win) < 2:
            return False
        (t0, a), (t1, b) = win[0], win[-1]
        used = b.cpu_seconds_between(a)
        if used is None or t1 <= t0:
            return False
        return used / (t1 - t0) >= self.th.busy_cpu_cores / 2

    def _waits_on(self, pid: int, jv: JobView) -> tuple[rankstate.WaitsOn, str]:
        """What it waits on, and for a worker of its own which one and what that one does."""
        W = rankstate.WaitsOn
        rd = jv.readings[pid]
        loc = rd.local
        if loc in (Local.SPINNING, Local.WAITING):
            return W.PEER, ""
        if loc == Local.STOPPED:
            return W.STOPPED, ""
        if loc == Local.SERVING:
            return W.OUTSIDE, ""
        if loc == Local.WORKER_WAIT:
            kids = self._children(pid)
            if not kids:
                return W.OWN_WORKER, "a thread of its own"
            words = []
            for c in kids[:3]:
                lp = self.view.procs[c].latest()
                assert lp is not None
                doing = "working" if self._child_works(c, jv.t) else \
                    (f"sleeping in {lp.wchan}" if lp.wchan and lp.wchan != "0" else f"state {lp.state}")
                words.append(f"pid {c} ({doing})")
            name = "DataLoader worker" if "dataloader" in (self._track(pid).verdict.frame or "").lower() else "worker"
            return W.OWN_WORKER, f"its {name}{'s' if len(kids) > 1 else ''} " + ", ".join(words) + \
                (f" and {len(kids) - 3} more" if len(kids) > 3 else "")
        kind = self._track(pid).verdict.kind
        if kind == "lock_wait":
            return W.LOCK, ""
        if kind == "sleeping":
            return W.SLEEP, ""
        if loc in (Local.QUIET, Local.CPU, Local.IO_WAIT):
            return W.UNKNOWN, ""
        return W.NOTHING, ""

    def _first_evidence(self, pid: int, jv: JobView) -> bool:
        """Setting up ends with the first sign of what the process is for, whatever its age: GPU
        work, memory beyond a CUDA context, loading, writing, capture, compiling, a wait, a request
        loop, a stack that says where it is, CPU work of its own once the imports are over (its GPU
        context exists, or past the setup window), or sleeping a few seconds after its setup."""
        th = self.th
        p = self._track(pid)
        s = jv.sigs[pid]
        loc = jv.readings[pid].local
        t = jv.t
        asleep = (s.cpu_cores or 0) < th.startup_quiet_cpu_cores and s.state in ("S", "I") and loc == Local.QUIET
        p.quiet_since = (p.quiet_since if p.quiet_since is not None else t) if asleep else None
        working = loc in (Local.LOADING, Local.WRITING, Local.IO_WAIT, Local.CPU, Local.BUSY)
        p.working_since = (p.working_since if p.working_since is not None else t) if working else None
        if loc == Local.WAITING and p.verdict.kind == "store":
            return False  # the rendezvous of its start-up: still setting up (a hang says itself)
        if loc in (Local.SERVING, Local.SPINNING, Local.WAITING, Local.WORKER_WAIT, Local.GRAPH_CAPTURE,
                   Local.COMPILING, Local.STOPPED):
            return True
        if loc == Local.BUSY and s.gpu.works(th):
            return True
        fresh = p.verdict_t is not None and t - p.verdict_t <= th.stack_repeat_s
        if working and fresh and p.verdict.kind == "importing":
            return False  # its stack says it still imports
        moving = loc in (Local.LOADING, Local.WRITING) and (bool(s.gpu_indexes) or s.age_s >= th.startup_imports_s) \
            and t - (p.working_since or t) >= th.startup_work_s
        if working and (fresh and p.verdict.known or s.age_s >= th.startup_cpu_s or moving):
            # its own code (a stack says so), past the imports, or moving data faster than imports do
            return True
        if s.gpu_mem >= th.started_gpu_mem_bytes and loc == Local.QUIET and s.wchan in SLEEP_WCHANS:
            return True  # set up (its memory is in) and asleep in a loop of its own: idle, not blocked
        if loc == Local.QUIET and p.verdict.known and p.verdict_t is not None and p.verdict.kind != "importing":
            return True
        if p.quiet_since is not None and (t - p.quiet_since >= th.startup_quiet_s and s.age_s >= th.startup_quiet_s
                                          or s.age_s >= th.startup_cpu_s + th.startup_quiet_s):
            return True
        return s.age_s >= th.startup_max_s

    def _set_state(self, pid: int, job: Job, state: State, reason: str, t: float, s: ProcSignals) -> StateChange | None:
        p = self._track(pid)
        if state == p.state:
            p.pending = None
            p.reason = reason
            return None
        # hung is said at once (the incident says it too); orphaned holds for the dwell like the rest:
        # a job torn down rank by rank has its launcher gone a moment before its ranks
        immediate = p.state is None or state == State.HUNG
        if not immediate:
            if p.pending != state:
                p.pending, p.pending_since = state, t
                return None
            if t - p.pending_since < (self.th.idle_dwell_s if state == State.IDLE else self.th.dwell_s):
                return None
        p.state, p.since, p.reason, p.pending = state, t, reason, None
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
        for key in [k for k in self._fr_out if k[0] not in self.job_tracks]:
            del self._fr_out[key]

    # ------------------------------------------------------------------ requests

    def _ask_for_evidence(self, jv: JobView) -> None:
        th = self.th
        tr, live, t = jv.track, jv.live, jv.t
        if not live:
            return
        if jv.quiet < th.stack_quiet_s:
            tr.stacks_asked = []
            tr.native_asked = False
            return
        if all(jv.readings[p].local == Local.BUSY for p in live):
            return
        asked = tr.stacks_asked
        if not asked or (len(asked) < 2 and t - asked[-1] >= th.stack_repeat_s) or t - asked[-1] >= th.stack_recapture_s:
            asked.append(t)
            del asked[:-4]
            self.requests.stacks.extend((p, False) for p in live)
        if tr.hung and not tr.native_asked:
            tr.native_asked = True
            self.requests.stacks.extend((p, True) for p in live)
            self.requests.ras = True
            if tr.fr_asked is None or t - tr.fr_asked > th.fr_rerequest_s:
                tr.fr_asked = t
                self.requests.fr_dumps.extend(live)


def _fr_key(f: Finding) -> tuple[str, str | None, int | None, tuple[str, ...]]:
    return f.kind, f.pg, f.seq, tuple(sorted(set(f.nodes.values()))) if f.kind == FindingKind.NODE_SILENT else ()


def _fr_width(f: Finding) -> int:
    return len(set(f.ranks) | set(f.missing_ranks))


def _wait_point(h: ProcHistory) -> str | None:
    """Where in the kernel the process waits: the wchan of its newest reading outside a tracing
    stop (state ``t``: a stack capture or a debugger holds it a moment, and says nothing of the program)."""
    for _, ps in reversed(h.samples):
        if ps.state != "t":
            return ps.wchan
    return None


def _same_wait_point(wchan: str | None, s: ProcSignals) -> bool:
    return wchan is None or s.wchan is None or s.state == "t" or wchan == s.wchan
