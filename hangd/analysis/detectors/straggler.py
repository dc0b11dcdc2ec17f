"""A rank that others keep waiting for while the job still progresses (``straggler``, a warning):
in a sliding window, the seconds its peers spent waiting on it. A rank that waits for requests (a
server's coordinator) is not a straggler, and a rank that makes the others wait for good is a hang
in the making, not a straggler."""

from __future__ import annotations

from hangd.analysis import gpucause
from hangd.analysis.detectors import Env
from hangd.analysis.model import Local
from hangd.analysis.views import JobTrack, JobView
from hangd.incidents import Family, IncidentKind

FAMILY = Family.STRAGGLER


def track_episodes(env: Env, jv: JobView) -> None:
    """Who waits for whom this second (also used by the state decision)."""
    tr, t = jv.track, jv.t
    waiting = jv.waiting
    # a rank that waits for requests, or whose job was last judged an idle server (its collectives
    # keep completing and nobody works: the others wait for its next empty batch), keeps nobody waiting
    serving = jv.serving | {p for p in jv.live if (tp := env.tracks.get(p)) is not None and tp.rule == "idle_server"}
    culprits = frozenset(p for p in jv.live if p not in waiting and p not in serving) if waiting else None
    if culprits is not None and not tr.hung:
        if tr.episode != culprits:
            tr.episode, tr.episode_start = culprits, t
            tr.episodes.append((t, culprits))
        if len(jv.live) > 1 and culprits:
            tr.blame.append((int(t), culprits, frozenset(waiting)))
    else:
        tr.episode = None
    while tr.blame and t - tr.blame[0][0] > env.th.straggler_window_s:
        tr.blame.popleft()


def step(env: Env, jv: JobView) -> None:
    th = env.th
    job, tr, t, live = jv.job, jv.track, jv.t, jv.live
    seconds: dict[int, set[int]] = {}
    for sec, c, _ in tr.blame:
        for p in c:
            seconds.setdefault(p, set()).add(sec)
    blamed = {p: len(secs) for p, secs in seconds.items() if p in live}
    worst = [p for p, n in blamed.items() if n >= th.straggler_wait_s and _kept_waiting(env, tr, p, t)
             and not _stuck_now(env, jv, p)] if not tr.hung else []
    inc = env.book.get(job.id, FAMILY)
    if worst and inc is None and _hang_within(env, job.id, t - th.straggler_window_s):
        worst = []  # one event, one incident: these waits were the hang's, already reported
    if worst and inc is None:
        inc = env.book.open_incident(IncidentKind.STRAGGLER, job.id, t)
        inc.pids = list(job.pids)
        inc.ranks = [job.ranks[p] for p in job.pids]
    if inc is None:
        return
    if worst:
        order = jv.by_rank(worst)
        inc.culprit_pids = order
        inc.culprit_ranks = [job.ranks[p] for p in order]
        waiters = sorted({job.ranks[w] for p in worst for w in _victims(tr, p) if w in job.ranks})
        inc.summary = (f"rank {', '.join(map(str, inc.culprit_ranks))} kept rank{'s' if len(waiters) > 1 else ''} "
                       f"{', '.join(map(str, waiters))} waiting in collectives for {max(blamed[p] for p in worst)} s "
                       f"of the last {th.straggler_window_s:.0f} s while the job still progressed")
        inc.evidence = {"wait_seconds_by_rank": {str(job.ranks[p]): n for p, n in blamed.items()},
                        "culprit": {str(job.ranks[p]): jv.readings[p].why for p in worst if p in jv.readings}}
        hw_parts, hw_ev = gpucause.straggler(env.view, jv, order, th.straggler_window_s)
        if hw_parts:
            inc.summary += ". " + ". ".join(hw_parts)
        if hw_ev:
            inc.evidence["hardware"] = hw_ev
        env.book.touch(inc, t, f"culprit ranks {inc.culprit_ranks}")
    elif not live or tr.hung or not tr.blame or t - tr.blame[-1][0] > th.straggler_quiet_after_s:
        env.book.resolve(inc, t, "the job is gone or hung" if not live or tr.hung else
                         f"no rank has made the others wait for {th.straggler_quiet_after_s:.0f} s")


def _victims(tr: JobTrack, pid: int) -> set[int]:
    """The ranks that waited on ``pid`` in the window (never itself)."""
    return {w for _, c, ws in tr.blame if pid in c for w in ws} - {pid}


def _kept_waiting(env: Env, tr: JobTrack, pid: int, t: float) -> bool:
    """The ranks that waited on ``pid`` got through their collectives several times meanwhile:
    progress of theirs between its waits, with waits on it after it (one long wait and the work
    after it, a rank loading its shards slowly while its peer sits in the barrier after its own
    load, is a phase, not a straggler); and recently so (a rank that made them wait for good is a
    hang in the making). Its own progress is not theirs."""
    secs = [sec for sec, c, _ in tr.blame if pid in c]
    victims = _victims(tr, pid)
    if not secs or not victims:
        return False
    worked = {sec for w in victims for sec in env.progress.of(w).strong_secs}
    between = {sec for sec in worked if secs[0] + 1 < sec < secs[-1]}
    return len(between) >= env.th.straggler_progressed_secs and _again(secs, worked, env.th.straggler_wait_s / 2) \
        and any((x := env.progress.of(w).last_work) is not None and t - x <= env.th.straggler_wait_s / 2 for w in victims)


def _again(secs: list[int], worked: set[int], enough: float) -> bool:
    """The waits on it recur: its seconds of keeping them waiting in which they did not work (a
    victim that worked in a second went through its collective in it), split into waits where
    they worked between (a second missing from the readings splits nothing), add up to
    ``enough`` beside the longest wait. One long wait and a short one (a slow load, then a step)
    is no pattern; a hang in the making is one long wait."""
    idle = sorted(set(secs) - worked)
    if not idle:
        return False
    waits, run = [], 1
    for a, b in zip(idle, idle[1:], strict=False):
        if any(a < sec < b for sec in worked):
            waits.append(run)
            run = 1
        else:
            run += 1
    waits.append(run)
    return sum(waits) - max(waits) >= enough


def _stuck_now(env: Env, jv: JobView, pid: int) -> bool:
    """It does not run late, it runs no more: stopped, or blocked on workers of its own none of
    which works (a DataLoader worker that blocked; a pool's thread at work keeps it running). Slow data (workers that work) makes a
    straggler; this is a hang in the making, which the hang detector reports."""
    rd = jv.readings.get(pid)
    if rd is None:
        return False
    return rd.local == Local.STOPPED or rd.local == Local.WORKER_WAIT and \
        not env.view.workers_work(pid, jv.job.ranks, jv.t)


def _hang_within(env: Env, job_id: str, since: float) -> bool:
    """A hang incident of the job was open at some moment since ``since``."""
    return any(i.job == job_id and i.family == "hang" and (i.resolved_at is None or i.resolved_at >= since)
               for i in env.book.all)
