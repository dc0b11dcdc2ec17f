"""Flight-recorder dumps and NCCL RAS answers arriving: this node's dumps and the other nodes',
compared across the ranks of each job; the findings attached to the job's open hang.

Functions of plain records (the ``Env`` the detectors share, the ``Flight`` record below, the
jobs of this tick), called by ``Analyzer.step`` as evidence comes in; none takes the Analyzer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hangd.analysis import report
from hangd.analysis.detectors import Env, hang, mismatch
from hangd.analysis.facts import job as job_facts
from hangd.analysis.identity import Job
from hangd.analysis.views import JobTrack
from hangd.flightrec.analyze import Finding, FindingKind, analyze
from hangd.snapshot import RemoteDump, Snapshot


@dataclass
class Flight:
    """What the flight-recorder stage keeps between ticks, and where its findings go."""

    say: Callable[[dict[str, Any]], None]  # a finding for /findings
    tracks: dict[str, JobTrack] = field(default_factory=dict)  # job -> its track (dumps, findings)
    # the flight-recorder dumps other nodes wrote of the ranks of jobs that span nodes: job -> (node, rank) -> dump
    remote: dict[str, dict[tuple[str, int], RemoteDump]] = field(default_factory=dict)
    # dumps read here of ranks of jobs that span nodes, for the other nodes: (job, rank) -> (t, Dump)
    out: dict[tuple[str, int], tuple[float, Any]] = field(default_factory=dict)
    unreadable: int = 0  # evidence files (flight-recorder dumps) that could not be decoded


def fr_arrived(env: Env, fl: Flight, jobs: dict[str, Job], snap: Snapshot, t: float) -> set[str]:
    """Take in this node's dumps; the jobs that got one."""
    by_job: dict[str, list[int]] = {}
    for d in snap.fr_dumps:
        if d.error is not None:
            fl.unreadable += 1
            fl.say({"t": round(t, 3), "kind": FindingKind.UNREADABLE, "pid": d.pid, "rank": d.rank,
                           "message": f"{d.path}: {d.error}", "source": d.source})
            continue
        dump = d.dump
        if dump is None:
            continue
        pid = d.pid
        # the job its process is a rank of (an exited rank stays in its job until it is forgotten),
        # else the dumps of one folder are one job
        job_id = next((j.id for j in jobs.values() if pid in j.ranks), f"fr:{d.path.rsplit('/', 1)[0]}")
        tr = fl.tracks.setdefault(job_id, JobTrack())
        rank = dump.rank if dump.rank is not None else d.rank
        if rank is None:
            continue
        prev = tr.fr.get(rank)
        # the groups it has a collective in flight in, where it has one: a side group that keeps
        # completing (a health check's all_reduce) says nothing of the group it waits in
        waits_in = {e.pg for e in dump.entries if not e.completed} & set(dump.pg_status)
        if prev is None and pid is not None and \
                (done := job_facts.recent_completions(dump.entries, waits_in, t, env.th.progress_recent_s)) is not None:
            env.progress.credit(pid, done[0], f"flight recorder: collectives completing ({done[1]:.0f} a second)",
                                strong=True, collectives_per_s=done[1], seen_at=t)
        if prev is not None and pid is not None:
            old_done, new_done = _done(prev[1], waits_in), _done(dump, waits_in)
            if new_done > old_done:
                # credit when the newest completed collective completed, as its recorder saw it (a queue
                # of hundreds issued at once completes long after), else when it was issued; not when
                # the dump came
                ended = [e.time_completed_ns for e in dump.entries if e.completed and e.time_completed_ns]
                created = [e.time_created_ns for e in dump.entries if e.completed and e.time_created_ns]
                at = min(t, max(ended or created) / 1e9) if ended or created else prev[0] + 0.01
                env.progress.credit(pid, at, f"flight recorder: completed collectives {old_done} -> {new_done}",
                                     strong=True, collectives_per_s=(new_done - old_done) / max(t - prev[0], 0.25),
                                     seen_at=t)
            elif t > prev[0]:
                env.progress.of(pid).collectives_at = None  # none completed since its last dump
        tr.fr[rank] = (t, dump)
        if pid is not None:
            tr.fr_pids[rank] = pid
        by_job.setdefault(job_id, []).append(rank)
        job = jobs.get(job_id)
        if env.node() is not None and job is not None and job.spans_nodes:
            fl.out[(job_id, rank)] = (t, dump)
    return set(by_job)

def _done(dump: Any, pgs: set[str]) -> int:
    """The highest completed seq of the dump's groups ``pgs`` (all of them when empty)."""
    return max((s.get("last_completed_collective") or 0 for pg, s in dump.pg_status.items() if not pgs or pg in pgs),
               default=0)

def remote_dumps_arrived(fl: Flight, dumps: list[RemoteDump]) -> set[str]:
    """Take in the other nodes' dumps; the jobs where one is new (or gone)."""
    new: dict[str, dict[tuple[str, int], RemoteDump]] = {}
    for d in dumps:
        new.setdefault(d.job, {})[(d.node, d.rank)] = d
    changed = set()
    for job_id in set(new) | set(fl.remote):
        old = {k: d.read_at for k, d in fl.remote.get(job_id, {}).items()}
        if old != {k: d.read_at for k, d in new.get(job_id, {}).items()}:
            changed.add(job_id)
    fl.remote = new
    return changed

def fr_analyze(env: Env, fl: Flight, jobs: dict[str, Job], job_id: str, t: float) -> None:
    """Cross-rank findings over the job's dumps: this node's, and for a job that spans nodes
    the other nodes' too. A dump read longer ago than the node-stale window, or from a node
    that stopped reporting, is not compared (its rank would look behind the others): the node
    is said to be silent instead."""
    th = env.th
    tr = fl.tracks.setdefault(job_id, JobTrack())
    job = jobs.get(job_id)
    spans = job is not None and job.spans_nodes
    # this node's dumps of an earlier hang are not compared with the other nodes' of this one
    dumps = {r: d for r, (at, d) in tr.fr.items() if not spans or at >= t - th.node_stale_s}
    if not dumps:
        return  # only the other nodes' dumps: their own nodes compare those
    nodes: dict[int, str] = {}
    silent: dict[str, list[RemoteDump]] = {}
    for (node, rank), rd in sorted(fl.remote.get(job_id, {}).items()) if job and job.spans_nodes else []:
        if rank in dumps and rank not in nodes:
            continue  # this node's own dump of the rank
        if rd.reported_at < t - th.node_stale_s or rd.read_at < t - th.node_stale_s:
            silent.setdefault(node, []).append(rd)
            continue
        dumps[rank], nodes[rank] = rd.dump, node
    for node, rds in sorted(silent.items()):
        rd = rds[0]
        ranks = sorted(x.rank for x in rds)
        plural = "s" if len(ranks) > 1 else ""
        why = (f"no report since {report.clock(rd.reported_at)}" if rd.reported_at < t - th.node_stale_s
               else f"its newest flight-recorder dump{plural} (read at {report.clock(max(x.read_at for x in rds))}) "
                    f"{'are' if plural else 'is'} older than {th.node_stale_s:.0f} s")
        fr_finding(env, fl, jobs, job_id, tr, Finding(
            kind=FindingKind.NODE_SILENT, pg=None, seq=None, op=None, ranks=ranks, nodes={r: node for r in ranks},
            message=f"{node}: {why}; the flight-recorder entries of its rank{plural} {', '.join(map(str, ranks))} "
                    "are not compared"), t)
    if len(dumps) < 2:
        return
    for f in analyze(list(dumps.values()), nodes=nodes):
        fr_finding(env, fl, jobs, job_id, tr, f, t)

def fr_finding(env: Env, fl: Flight, jobs: dict[str, Job], job_id: str, tr: JobTrack, f: Finding, t: float) -> None:
    key = _fr_key(f)
    if f.kind in (FindingKind.MISSING_RANK, FindingKind.STUCK) and job_progressing(env, jobs.get(job_id), t):
        return  # a dump of a job that still progresses catches collectives in flight
    tr.finding_at[key[:3]] = t  # shown again: still so, now
    wider = None
    if key in tr.fr_keys:
        # the same finding over more ranks (the other nodes' dumps came after this node's own)
        # takes the place of the narrower one; otherwise it is said once
        wider = next((i for i, x in enumerate(tr.findings) if _fr_key(x) == key and _fr_width(x) < _fr_width(f)), None)
        if wider is None:
            return
    tr.fr_keys.add(key)
    f.source = "flight_recorder"
    if wider is None:
        tr.findings.append(f)
        while len(tr.findings) > env.th.fr_findings_kept:
            old = tr.findings.pop(0)
            tr.fr_keys.discard(_fr_key(old))
            tr.finding_at.pop(_fr_key(old)[:3], None)
    else:
        tr.findings[wider] = f
    fl.say({"t": round(t, 3), "job": job_id, **f.to_dict()})
    if f.kind in mismatch.KINDS:
        mismatch.step(env, job_id, jobs.get(job_id), tr, f, t, wider=wider is not None)
    inc = env.book.get(job_id, hang.FAMILY)
    if inc is not None:
        inc.findings = [x.to_dict() for x in tr.findings]
        inc.evidence["flight_recorder"] = inc.findings
        env.book.touch(inc, t, "flight-recorder findings attached")

def ras_arrived(env: Env, fl: Flight, jobs: dict[str, Job], r: Any, t: float) -> None:
    """NCCL RAS's view (which rank launched fewer operations, which are missing), attached to
    the open hang incident of the job whose processes it names."""
    st = r.status
    if st is None:
        return
    d = {"t": round(t, 3), "kind": "nccl_ras", "source": "nccl_ras", **st.to_dict()}
    fl.say(d)
    pids, behind, note = st.pids(), st.behind(), st.words()
    for job_id, tr in fl.tracks.items():
        job = jobs.get(job_id)
        if job is not None and pids & set(job.pids):
            # the ranks that launched fewer operations than the others never launched the one the
            # others wait in: the hang's culprit (a rank that skipped a collective among them)
            tr.ras = (t, [x["pid"] for x in behind if x["pid"] in job.ranks], note)
    for (_job, family), inc in env.book.open.items():
        if family == hang.FAMILY and pids & set(inc.pids):
            inc.evidence["nccl_ras"] = d
            if behind:
                inc.findings.append({"kind": "ras_behind", "source": "nccl_ras", "ranks": [x["rank"] for x in behind],
                                     "pids": [x["pid"] for x in behind], "message": note})
            env.book.touch(inc, t, note)


def job_progressing(env: Env, job: Job | None, t: float) -> bool:
    """A rank of the job made strong progress within the stack-quiet window."""
    if job is None:
        return False
    _, strong = env.progress.job_last(job.pids)
    return strong is not None and strong >= t - env.th.stack_quiet_s

# ------------------------------------------------------------------ per tick


def _fr_key(f: Finding) -> tuple[str, str | None, int | None, tuple[str, ...]]:
    return f.kind, f.pg, f.seq, tuple(sorted(set(f.nodes.values()))) if f.kind == FindingKind.NODE_SILENT else ()


def _fr_width(f: Finding) -> int:
    return len(set(f.ranks) | set(f.missing_ranks))
