"""A rank that exited while its peers still run and no longer progress: they will wait for it
until their collective timeout (``rank_exited``). Ranks that all exit within the grace period
ended the job (unless every rank left waits for a peer, in a collective or the store, for
``rank_exit_wait_s``: NCCL and the store wait for the one that left until their timeout), and a peer that keeps progressing after a rank exited (saving a checkpoint, its
own last steps) is not waiting for it: neither is an incident."""

from __future__ import annotations

from hangd.analysis import report
from hangd.analysis.detectors import Env
from hangd.analysis.facts import job as job_facts
from hangd.analysis.views import JobView
from hangd.incidents import Family, Incident, IncidentKind

FAMILY = Family.HANG


def pending(env: Env, jv: JobView) -> bool:
    """A rank exited moments ago: what the others do next is judged as its consequence first."""
    tr = jv.track
    return bool(jv.live) and any(p not in tr.exits_reported and jv.t - _settled(jv, at) < env.th.rank_exit_grace_s + env.th.window_s
                                 for p, at in tr.exited.items())


def _settled(jv: JobView, exit_at: float) -> float:
    """Since when the job has been still after a rank exited: the exit, or the last progress after it
    (a peer finishing a checkpoint, then blocking in the collective the one that left never joins)."""
    return max(exit_at, jv.last_strong or exit_at)


def step(env: Env, jv: JobView) -> Incident | None:
    """The job's open rank_exited incident, if any (it shares the hang family: one at a time)."""
    th = env.th
    job, tr, t = jv.job, jv.track, jv.t
    inc = env.book.get(job.id, FAMILY)
    if inc is not None and inc.kind != IncidentKind.RANK_EXITED:
        return None
    if inc is not None and not jv.live:
        env.book.resolve(inc, t, "the job's processes are gone")
        return None
    if not tr.exited or not jv.live:
        return inc
    new_exits = {p: at for p, at in tr.exited.items() if p not in tr.exits_reported}
    if not new_exits:
        if inc is not None:
            _newer_stacks(env, jv, inc)
        return inc
    first_exit = min(new_exits.values())
    # every rank left waits for a peer since the exit: for the one that left, whatever the grace
    all_wait = bool(jv.live) and jv.waiting >= set(jv.live) and tr.episode is not None \
        and t - max(first_exit, tr.episode_start) >= th.rank_exit_wait_s
    # ... or every rank left has been still since the exit, waiting or asleep, for as long
    all_wait = all_wait or (t - first_exit >= th.rank_exit_wait_s and job_facts.still_since(jv, first_exit, th.window_s)[0])
    if t - _settled(jv, first_exit) < th.rank_exit_grace_s and not all_wait:
        return inc
    # progressed after the exit (past one window) and now not waiting on a peer: it went on alone
    # (its own last steps, a checkpoint), not waiting for the one that left
    if jv.last_strong is not None and jv.last_strong > first_exit + th.window_s and not (jv.waiting or jv.spinning):
        return inc
    holders = [p for p in jv.live if (s := jv.sigs.get(p)) is not None and s.gpu_mem > 0] or list(jv.live)
    exited = sorted(new_exits, key=lambda p: job.ranks.get(p, 0))
    tr.exits_reported |= set(exited)
    if inc is None:
        inc = env.book.open_incident(IncidentKind.RANK_EXITED, job.id, t, hang_started_at=first_exit)
    inc.pids = list(job.pids)
    inc.ranks = [job.ranks[p] for p in job.pids]
    inc.culprit_pids = sorted(set(inc.culprit_pids) | set(exited), key=lambda p: job.ranks.get(p, 0))
    inc.culprit_ranks = [job.ranks[p] for p in inc.culprit_pids if p in job.ranks]
    left = ", ".join(f"rank {job.ranks[p]} (pid {p})" for p in holders)
    inc.summary = (f"rank {', '.join(str(r) for r in inc.culprit_ranks)} exited {t - first_exit:.0f} s ago "
                   f"while {left} still run{'s' if len(holders) == 1 else ''} and "
                   f"{'has' if len(holders) == 1 else 'have'} not progressed since: "
                   "they will wait for it until their collective timeout")
    exc = report.exceptions(env.view, job, first_exit - th.exception_lookback_s)
    if exc:
        inc.summary = "Probable cause, from " + report.quote_exception(exc[-1]) + ". " + inc.summary
    inc.evidence = report.evidence(env.view, env.tracks, job, jv.sigs, t - first_exit)
    if exc:
        inc.evidence["exceptions"] = exc[-5:]
    env.book.touch(inc, t, f"rank {', '.join(str(job.ranks[p]) for p in exited)} exited")
    return inc


def _newer_stacks(env: Env, jv: JobView, inc: Incident) -> None:
    """A stack of a rank left that came after the incident opened (the exit is judged on stillness,
    before any stack need come): where it waits for the one that left, in the incident too."""
    stacks = inc.evidence.setdefault("stacks", {})
    for p in jv.live:
        tp = env.tracks.get(p)
        if tp is None or tp.verdict_t is None:
            continue
        r = str(jv.job.ranks[p])
        if (stacks.get(r) or {}).get("t", 0) < tp.verdict_t and (st := report.stack_brief(env.view, tp, p)):
            stacks[r] = st
