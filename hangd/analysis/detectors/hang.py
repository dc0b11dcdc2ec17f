"""Hangs: no rank of a distributed job progresses and at least one is positively stuck: spinning
in a GPU collective (``nccl_stall``), blocked host-side in a collective (``host_stall``), stopped,
or in uninterruptible I/O (``io_stall``).

Not hangs: a lone process (there is no peer to wait for: it is idle), and an inference server whose
coordinating rank waits for requests while the others wait for it in a broadcast (serving).
The culprit, once found on evidence, is kept unless stronger evidence names another.
"""

from __future__ import annotations

from hangd.analysis import report
from hangd.analysis.detectors import Env
from hangd.analysis.model import Local
from hangd.analysis.views import Culprit, JobView
from hangd.incidents import HANG_KINDS, IncidentKind

FAMILY = "hang"


def decide(env: Env, jv: JobView) -> IncidentKind | None:
    """The kind of hang this tick's view shows, or None."""
    th = env.th
    live = jv.live
    if not live or all(jv.readings[p].local == Local.BUSY for p in live):
        return None
    spinning, waiting, stopped = jv.spinning, jv.waiting, jv.stopped
    io_stuck = jv.with_local(Local.IO_WAIT)
    # a peer to wait for: several ranks, a world size above one, or a rank positively in a collective
    if not (jv.job.distributed or waiting):
        return None
    others = set(live) - waiting
    if waiting and others and others <= jv.serving:
        return None  # the ranks wait for one that waits for requests: an idle server
    if spinning and jv.quiet >= th.hang_gpu_s:
        return IncidentKind.NCCL_STALL
    if stopped and jv.quiet >= th.hang_gpu_s and (waiting or jv.job.distributed):
        return IncidentKind.HOST_STALL
    if waiting and jv.quiet >= th.hang_host_s:
        return IncidentKind.HOST_STALL
    if io_stuck and jv.quiet >= th.hang_io_s:
        return IncidentKind.IO_STALL
    return None


def step(env: Env, jv: JobView, blocked_by_exit: bool) -> None:
    """Open, update or resolve the job's hang incident."""
    tr = jv.track
    kind = decide(env, jv)
    inc = env.book.get(jv.job.id, FAMILY)
    if tr.hung:
        # a hung job un-hangs only on strong progress after it was judged hung
        if jv.live and jv.last_strong is not None and jv.last_strong > (tr.hung_at or jv.t):
            tr.hung = False
            tr.culprit = None
            if inc is not None and inc.kind in HANG_KINDS:
                env.book.resolve(inc, jv.t, f"progress resumed: {env.progress.why_strongest(jv.live)}")
        elif not jv.live:
            tr.hung = False
            if inc is not None:
                env.book.resolve(inc, jv.t, "the job's processes are gone")
    elif kind is not None:
        tr.hung, tr.hung_at, tr.waiters = True, jv.t, set()
    if not tr.hung:
        return
    if kind is None and inc is not None:
        kind = IncidentKind(inc.kind) if inc.kind in HANG_KINDS else None
    if kind is None:
        return
    if inc is None:
        if blocked_by_exit:
            return
        inc = env.book.open_incident(kind, jv.job.id, jv.t, hang_started_at=jv.last_progress)
    if inc.kind in HANG_KINDS:
        fill(env, jv, inc)


def _culprit(env: Env, jv: JobView) -> Culprit | None:
    """The strongest evidence this tick of who the others wait for."""
    job, tr = jv.job, jv.track
    rank_pid = job.rank_pid()
    missing = [f for f in tr.findings if f.kind == "missing_rank"]
    if missing:
        pids = [rank_pid[r] for r in missing[0].missing_ranks if r in rank_pid]
        if pids:
            return Culprit(pids, 4, "flight recorder: " + missing[0].message)
    if jv.stopped:
        return Culprit(jv.by_rank(jv.stopped), 3, "stopped")
    waiting = jv.waiting | {p for p in tr.waiters if p in jv.live}
    if waiting:
        others = [p for p in jv.live if p not in waiting]
        # a rank whose stack shows it somewhere else is the one they wait for; a rank with no stack
        # yet may just not have been captured (stacks of several ranks arrive over a few ticks)
        seen = [p for p in others if (tp := env.tracks.get(p)) is not None and tp.verdict_t is not None]
        if seen:
            return Culprit(jv.by_rank(seen), 2, "its peers wait for it in a collective; its stack is elsewhere")
        if others:
            return Culprit(jv.by_rank(others), 1, "its peers wait for it in a collective")
    return None


def fill(env: Env, jv: JobView, inc: object) -> None:
    from hangd.incidents import Incident

    assert isinstance(inc, Incident)
    job, tr = jv.job, jv.track
    tr.waiters |= jv.waiting
    new = _culprit(env, jv)
    alive = set(jv.live) | set(tr.exited)
    if new is not None and (tr.culprit is None or new.strength >= tr.culprit.strength
                            or not set(tr.culprit.pids) & alive):
        tr.culprit = new
    culprits = [p for p in (tr.culprit.pids if tr.culprit else []) if p in job.ranks]
    inc.pids = list(job.pids)
    inc.ranks = [job.ranks[p] for p in job.pids]
    inc.culprit_pids = culprits
    inc.culprit_ranks = [job.ranks[p] for p in culprits]
    readings = jv.readings
    waiters = jv.by_rank({p for p in tr.waiters if p in jv.live} - set(culprits))
    parts = []
    if culprits:
        who = ", ".join(f"rank {job.ranks[p]} (pid {p})" for p in culprits)
        one = len(culprits) == 1
        parts.append(f"{who} {'is' if one else 'are'} not in the collective {'its' if one else 'their'} peers wait in: "
                     + "; ".join(f"rank {job.ranks[p]}: {readings[p].why}" if p in readings
                                 else f"rank {job.ranks[p]}: exited at {report.clock(tr.exited[p])}"
                                 for p in culprits if p in readings or p in tr.exited))
    if waiters:
        waited = jv.t - (inc.hang_started_at if inc.hang_started_at is not None else jv.last_progress)
        parts.append("; ".join(f"rank {job.ranks[p]} has waited {waited:.0f} s: {readings[p].why}"
                               for p in waiters if p in readings))
    if not culprits and not waiters:
        parts.append(f"no rank has progressed for {jv.quiet:.0f} s")
    for p in culprits:
        st = report.stack_brief(env.view, env.tracks.get(p), p)
        if st and st["frames"]:
            parts.append(f"rank {job.ranks[p]}'s stack: " + " <- ".join(st["frames"][:4]))
        s = jv.sigs.get(p)
        if s is not None and s.threads_lost_at is not None and s.threads_lost_at >= (inc.hang_started_at or jv.t) - env.th.exception_lookback_s:
            parts.append(f"rank {job.ranks[p]} lost a thread at {report.clock(s.threads_lost_at)} "
                         f"({s.threads_before} -> {s.threads_after} threads)")
    missing = next((f for f in tr.findings if f.kind == "missing_rank"), None)
    if missing is not None:
        parts.insert(0, "Flight recorder: " + missing.message)
    exc = report.exceptions(env.view, job, (inc.hang_started_at or jv.t) - env.th.exception_lookback_s)
    if exc:
        parts.insert(0, "Probable cause, from " + report.quote_exception(exc[-1]))
    inc.summary = ". ".join(parts) + "."
    inc.evidence = report.evidence(env.view, env.tracks, job, jv.sigs, jv.quiet)
    if exc:
        inc.evidence["exceptions"] = exc[-5:]
    if tr.culprit is not None:
        inc.evidence["culprit_from"] = tr.culprit.source
    inc.findings = [f.to_dict() for f in tr.findings]
    inc.evidence["flight_recorder"] = inc.findings
    base = inc.next_step.split(" Flight recording is off")[0]
    inc.next_step = base + (" " + report.FR_HINT if not tr.fr and report.flight_recording_off(env.view, job) else "")
    env.book.touch(inc, jv.t, f"culprit ranks {inc.culprit_ranks}" if inc.culprit_ranks else None)
