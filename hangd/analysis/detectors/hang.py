"""Hangs: no rank of a distributed job progresses and at least one is positively stuck: spinning
in a GPU collective (``nccl_stall``), blocked host-side in a collective (``host_stall``), stopped,
or in uninterruptible I/O (``io_stall``).

Not hangs: a lone process (there is no peer to wait for: it is idle), and an inference server whose
coordinating rank waits for requests while the others wait for it in a broadcast (serving).
The culprit, once found on evidence, is kept unless stronger evidence names another.
"""

from __future__ import annotations

from typing import Any

from hangd.analysis import gpucause, otherend, report, stackcat
from hangd.analysis.detectors import Env
from hangd.analysis.facts import job as job_facts
from hangd.analysis.facts.stack import WAIT_VERDICTS
from hangd.analysis.model import Local, Strength
from hangd.analysis.thresholds import Thresholds
from hangd.analysis.views import Culprit, JobTrack, JobView
from hangd.flightrec.analyze import Finding, FindingKind
from hangd.incidents import HANG_KINDS, Family, Incident, IncidentKind
from hangd.snapshot import RemoteRank

FAMILY = Family.HANG


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
    # a job that spans nodes: its ranks on the other nodes, as their nodes judge them
    fresh = jv.remote_fresh
    away_waiting = [r for r in fresh if r.waits]
    away_other = [r for r in fresh if not r.waits]
    others = set(live) - waiting
    if jv.idle[0]:
        # the ranks here wait for one here that waits for requests, or their collectives keep
        # completing while none of them works: an idle server, whatever elsewhere
        return None
    if (waiting or away_waiting) and (others or away_other) and others <= jv.serving \
            and all(r.local == Local.SERVING for r in away_other):
        return None  # the ranks wait for ones that wait for requests (here or on other nodes): an idle server
    # the collectives they wait in keep completing (a dump's sample since the job's last work, their
    # wake-ups): slow, not stalled
    work = env.progress.job_last_work(live)
    if any(job_facts.collectives_completing(env.progress.of(p), jv.sigs[p], env.last_wait(p, jv.sigs[p], jv.t), jv.t,
                                            th, work) is not None for p in waiting):
        return None
    if jv.quiet < th.hang_all_in_s and job_facts.every_rank_in_one_wait(jv, env.tracks, th.window_s)[0] \
            and not _recorder_says_stalled(env, jv):
        return None  # every rank is in the collective: slow, or stalled in the transport, not yet told
    if spinning and jv.quiet >= th.hang_gpu_s:
        return IncidentKind.NCCL_STALL
    # ranks blocked in a collective of an NCCL process group with kernels on their GPU: an NCCL
    # stall, whether or not the GPU shows the kernel spinning (ranks sharing a GPU). With their GPUs
    # idle the collective never reached them (a CPU group's broadcast, a communicator still being
    # set up): blocked host-side
    host = IncidentKind.NCCL_STALL if spinning or any(_in_nccl(env, jv, p) for p in waiting) else IncidentKind.HOST_STALL
    if stopped and jv.quiet >= th.hang_stopped_s and (waiting or jv.job.distributed):
        return host
    # an exception in the job's logs as it went still (a worker thread that died, a shape mismatch),
    # and ranks waiting in a collective since: they wait for what will not come
    if (waiting or spinning) and jv.quiet >= th.hang_after_exception_s and _exception_as_it_stopped(env, jv):
        return host
    # the ranks not waiting are each blocked in a wait of their own that no timeout ends: they never woke
    # since their stacks showed it, and nothing of the job moved for hang_stuck_s
    if waiting and others and jv.quiet >= th.hang_stuck_s and not away_other \
            and all(stuck_in_own_wait(env, jv, p) for p in others):
        return host
    # waiting ranks on another node count: the node of the rank they wait for judges the hang too
    if (waiting or away_waiting) and jv.quiet >= th.hang_host_s:
        return host
    if io_stuck and jv.quiet >= th.hang_io_s:
        return IncidentKind.IO_STALL
    return None


def _recorder_says_stalled(env: Env, jv: JobView) -> bool:
    """A flight recorder's finding of this stall, or NCCL RAS counting ranks behind since the job
    last progressed: the ranks' own record of their collectives, which their stacks cannot show."""
    tr = jv.track
    if any(_of_this_stall(tr, f, jv.last_progress, env) for f in tr.findings):
        return True
    return tr.ras is not None and bool(tr.ras[1]) and tr.ras[0] >= jv.last_progress - env.th.window_s


def still_waiting(jv: JobView, tr: JobTrack, th: Thresholds) -> bool:
    """Every rank that waited in the hang (``tr.waiters``) and still runs is still in its wait, on
    evidence of now: its GPU still spins in the collective, or it reads a wait for a peer and its
    main thread has not woken since the hang was judged (a collective that completes wakes it).
    Bytes it reads or writes meanwhile (a dump of its own, libraries read to symbolize a stack)
    do not take it out of the collective. False where no waiter is known."""
    waiters = [p for p in tr.waiters if p in jv.sigs]
    since = jv.t - (tr.hung_at if tr.hung_at is not None else jv.t)

    def waits(p: int) -> bool:
        s = jv.sigs[p]
        return s.gpu.spins(th) or (jv.readings[p].local.waits_for_peer and s.asleep_s is not None and s.asleep_s >= since)

    return bool(waiters) and all(waits(p) for p in waiters)


def stuck_in_own_wait(env: Env, jv: JobView, pid: int) -> bool:
    """Blocked in a wait of its own that no timeout ends: its stack showed the wait
    (``stackcat.OWN_WAIT_KINDS``) and its main thread has not woken since, or its descriptors place
    its main thread's wait on a thread or worker of its own (``otherend``); asleep ``hang_stuck_s``
    at least, on no CPU, and no worker of it works (a timed wait, a poll loop, a DataLoader's queue
    read that checks its workers, all wake)."""
    th, s, tp = env.th, jv.sigs[pid], env.tracks.get(pid)
    if tp is None or s.asleep_s is None:
        return False
    by_stack = tp.verdict_t is not None and tp.verdict.kind in stackcat.OWN_WAIT_KINDS
    workers = env.view.workers(pid, jv.job.ranks)
    oe = tp.other_end
    # the other end is a thread of its own, or workers of its own (not its launcher, nor a peer)
    by_descriptors = oe is not None and jv.readings[pid].local == Local.WORKER_WAIT and (
        oe.kind == otherend.OWN_THREAD or oe.kind == otherend.OWN_WORKER and bool(oe.pids) and set(oe.pids) <= set(workers))
    if not (by_stack or by_descriptors):
        return False
    if jv.readings[pid].local not in (Local.QUIET, Local.WORKER_WAIT) or (s.cpu_cores or 0) >= th.cpu_active_cores:
        return False
    if any(env.view.cpu_works(c, jv.t) for c in {*workers, *(oe.pids if oe is not None else ())} if c in env.view.procs):
        return False
    # what its descriptors say is now; a stack's wait holds only if it has not woken since the stack
    since_stack = jv.t - tp.verdict_t if by_stack and not by_descriptors and tp.verdict_t is not None else 0.0
    return s.asleep_s >= max(th.hang_stuck_s, since_stack)


def _exception_as_it_stopped(env: Env, jv: JobView) -> bool:
    return report.exception_as_it_stopped(env.view, jv.job, jv.last_progress, env.th.window_s)


def _in_nccl(env: Env, jv: JobView, pid: int) -> bool:
    """Its stack is in a collective, its process group runs NCCL's threads, and its GPU is not idle."""
    h = env.view.procs.get(pid)
    lp = h.latest() if h is not None else None
    s = jv.sigs[pid]
    return _stack_in_collective(env, pid) and env.tracks[pid].verdict.kind == "collective" and lp is not None \
        and any(n.startswith(("pt_nccl", "NCCL ", "ncclProxy")) for n in lp.dist_threads or ()) \
        and not (s.gpu_indexes and s.gpu.idle(env.th))


def step(env: Env, jv: JobView, blocked_by_exit: bool) -> None:
    """Open, update or resolve the job's hang incident."""
    tr = jv.track
    kind = decide(env, jv)
    inc = env.book.get(jv.job.id, FAMILY)
    if tr.hung:
        # a hung job un-hangs only on strong progress after it was judged hung, and once the wait it
        # hangs in is over: a rank's dump or log written while every rank that waited still waits
        # is no end of the hang (one hang, one incident)
        if jv.live and jv.last_strong is not None and jv.last_strong > (tr.hung_at or jv.t) \
                and not still_waiting(jv, tr, env.th):
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
        # when each rank stopped progressing, as of the hang: what a rank logs or writes while it
        # hangs (a watchdog's lines, a dump) moves its progress, not when the stall began
        tr.stopped_at = {p: x for p in jv.job.pids if (x := env.progress.of(p).last) is not None}
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


# What to do when the ranks' collectives diverged (said after the kind's own next step).
DIVERGED_HINT = ("The ranks make different collectives: every rank must make the same ones in the same order. "
                 "Look for a step one rank skips (uneven data across ranks, a batch skipped on an error, a "
                 "branch on the rank); torch.distributed.algorithms.Join handles uneven inputs, and "
                 "TORCH_DISTRIBUTED_DEBUG=DETAIL reports mismatched collectives as they happen.")


def _of_this_stall(tr: JobTrack, f: Finding, last_progress: float, env: Env) -> bool:
    """A finding shown by dumps taken since the job last progressed (a window's slack): one of
    dumps taken while it still worked (collectives in flight) is not evidence of this stall."""
    at = tr.finding_at.get((f.kind, f.pg, f.seq))
    return at is None or at >= last_progress - env.th.window_s


def _culprit(env: Env, jv: JobView) -> Culprit | None:
    """The strongest evidence this tick of who the others wait for."""
    job, tr = jv.job, jv.track
    rank_pid = job.rank_pid()
    missing = [f for f in tr.findings if f.kind == FindingKind.MISSING_RANK and _of_this_stall(tr, f, jv.last_progress, env)]
    if missing:
        f = missing[-1]  # the newest: one of an earlier hang of the job names who was missing then
        # a missing rank whose dump another node read is that node's rank, not this node's rank of that number
        pids = [rank_pid[r] for r in f.missing_ranks if r in rank_pid and r not in f.nodes]
        fresh = {(r.node, r.rank): r for r in jv.remote_fresh}
        remote = [fresh[(f.nodes[r], r)] for r in f.missing_ranks if (f.nodes.get(r), r) in fresh]
        if pids or remote:
            return Culprit(pids, Strength.FLIGHT_RECORDER, "flight recorder: " + f.message, remote=remote)
    if tr.ras is not None and tr.ras[1] and tr.ras[0] >= (tr.hung_at or jv.t) - env.th.window_s:
        # NCCL RAS counted the operations each rank launched: the ones behind never launched the
        # collective the others are in (read as the job hung, not of an earlier hang of the job)
        behind = [p for p in tr.ras[1] if p in jv.live or p in tr.exited]
        if behind:
            return Culprit(jv.by_rank(behind), Strength.FLIGHT_RECORDER, f"{tr.ras[2]}: the ranks behind never "
                           "launched the collective the others wait in", basis="ras")
    if jv.stopped:
        return Culprit(jv.by_rank(jv.stopped), Strength.STOPPED, "stopped")
    waiting = jv.waiting | {p for p in tr.waiters if p in jv.live}
    if waiting or any(r.waits for r in jv.remote_fresh):
        others = [p for p in jv.live if p not in waiting]
        if job.spans_nodes:
            # a rank whose last stack was in a collective is between two captures, not elsewhere: with
            # ranks on other nodes, the one they all wait for may well be there
            others = [p for p in others if not _stack_in_collective(env, p)]
        # a rank whose stack shows it somewhere else is the one they wait for; a rank with no stack
        # yet may just not have been captured (stacks of several ranks arrive over a few ticks)
        seen = [p for p in others if (tp := env.tracks.get(p)) is not None and tp.verdict_t is not None]
        if seen:
            return Culprit(jv.by_rank(seen), Strength.STACK, "its peers wait for it in a collective; its stack is elsewhere")
        if others:
            return Culprit(jv.by_rank(others), Strength.INFERRED, "its peers wait for it in a collective")
        # every rank here waits, and not in the same collective (their stacks say two call sites): their
        # collective sequences diverged (a rank skipped one, or made one the others do not). Which
        # one did is not in the stacks (on NCCL the flight recorder says it): no rank is blamed
        if not others and not jv.remote_fresh and len(waiting) > 1:
            sites = {p: site for p in waiting if (site := _collective_site(env, p, p in jv.spinning)) is not None}
            if len(sites) == len(waiting) and len(set(sites.values())) > 1:
                where = "; ".join(f"rank {job.ranks[p]} in {sites[p]}" for p in jv.by_rank(waiting))
                said = f"every rank waits, in different collectives ({where}): their collective sequences diverged"
                odd = _odd_ones(env, jv, sites)
                if odd is not None:
                    return Culprit(jv.by_rank(odd[0]), Strength.INFERRED, f"{said}; {odd[1]}", basis="diverged")
                return Culprit([], Strength.INFERRED, f"{said}, a rank skipped a collective or made one the others do not",
                               basis="diverged")
        # every rank here waits: for a rank on another node that its node reports outside a collective
        away = [r for r in jv.remote_fresh if r.waits is False]
        if away:
            return Culprit([], Strength.INFERRED, "its peers wait for it in a collective; its node reports it outside one",
                           remote=sorted(away, key=lambda r: (r.rank if r.rank is not None else 1 << 30, r.node)))
    return None


def _odd_ones(env: Env, jv: JobView, sites: dict[int, str]) -> tuple[list[int], str] | None:
    """Of ranks waiting at two collective call sites, the ones that diverged, and why they are
    taken for it; None when the stacks cannot tell.

    - The fewer: ranks at one site while more wait at the other are the odd ones out (they skipped
      the others' collective, or make one the others do not).
    - As many at each: the ones further along the code both stacks run, at the later line of the
      innermost function outside torch that both are in (the loop's code against the barrier after
      it, or the caller's next line). With collectives paired in order, a rank that skipped one runs out of
      them first and waits further on, at the next collective past the loop: uneven inputs, a
      batch skipped on one rank. A rank that makes an extra collective looks the same from the
      other side, so the summary says both."""
    groups: dict[str, list[int]] = {}
    for p, site in sites.items():
        groups.setdefault(site, []).append(p)
    if len(groups) != 2:
        return None
    a, b = sorted(groups.values(), key=len)
    if len(a) < len(b):
        return a, (f"rank{'s' if len(a) > 1 else ''} {', '.join(str(jv.job.ranks[p]) for p in jv.by_rank(a))} "
                   f"{'are' if len(a) > 1 else 'is'} the odd one{'s' if len(a) > 1 else ''} out: "
                   f"{len(b)} ranks wait in {sites[b[0]]}")
    # the innermost function both stacks are in (the same function may be reached by different callers)
    fa, fb = (_lines(env.tracks[g[0]].stack_sig) for g in (a, b))
    common = next((k for k in fa if k in fb), None)
    if common is None or fa[common] == fb[common]:
        return None
    ahead, la, lb = (a, fa[common], fb[common]) if fa[common] > fb[common] else (b, fb[common], fa[common])
    ranks = ", ".join(str(jv.job.ranks[p]) for p in jv.by_rank(ahead))
    return ahead, (f"rank{'s' if len(ahead) > 1 else ''} {ranks} went further in {common.rsplit('/', 1)[-1]} "
                   f"(line {la}, the others at line {lb}): past a collective the others wait in, it skipped one "
                   "(uneven inputs, a batch skipped) or the others make one it does not")


def _lines(sig: tuple[str, ...]) -> dict[str, int]:
    """A stack signature's functions outside torch (the collective's own frames are where both
    wait, not where they went), innermost first, each with its innermost line."""
    out: dict[str, int] = {}
    for key in sig:
        fn, _, line = key.rpartition(":")
        if line.isdigit() and fn not in out and not _in_torch(fn):
            out[fn] = int(line)
    return out


def _collective_site(env: Env, pid: int, spins: bool = False) -> str | None:
    """Where its newest Python stack waits: the innermost torch.distributed call (``barrier``,
    ``all_reduce``...) or autograd's backward (DDP's all_reduce), with the caller's line; None when
    its stack is not in one (a native-only capture names no call site to compare)."""
    tp = env.tracks.get(pid)
    frames = list(tp.stack_sig) if tp is not None else []  # innermost first, "file:name:line"
    # a stack no rule names a wait, innermost in torch.distributed (DDP's construction checking
    # the parameters across ranks), is in a collective of its own for a rank whose GPU spins in one
    if tp is None or tp.verdict.kind not in (*WAIT_VERDICTS, "backward") and not (
            spins and frames and "torch/distributed/" in frames[0]):
        return None
    for i, key in enumerate(frames):
        if "torch/distributed/" in key or "torch/autograd/" in key:
            caller = next((f for f in frames[i + 1:] if not _in_torch(f)), "")
            name = key.split(":")[1]
            return f"{name} called from {caller.rsplit('/', 1)[-1]}" if caller else name
    return None


def _in_torch(frame_key: str) -> bool:
    return frame_key.startswith("torch/") or "/torch/" in frame_key


def _stack_in_collective(env: Env, pid: int) -> bool:
    tp = env.tracks.get(pid)
    return tp is not None and tp.verdict_t is not None and tp.verdict.kind in WAIT_VERDICTS


def _remote_name(r: RemoteRank) -> str:
    return f"rank {r.rank} on {r.node} (pid {r.pid})"


def _fleet(env: Env, jv: JobView, inc: Incident, parts: list[str], local_culprits: list[int],
           remote_culprits: list[RemoteRank]) -> None:
    """What the other nodes of a job that spans nodes add: their waiting ranks, the nodes that
    stopped reporting (named, never blamed), and where every rank is."""
    waiting = sorted((r for r in jv.remote_fresh if r.waits), key=lambda r: (r.rank or 0, r.node))
    if waiting:
        by_node: dict[str, list[str]] = {}
        for r in waiting:
            by_node.setdefault(r.node, []).append(str(r.rank))
        parts.append("; ".join(f"rank{'s' if len(v) > 1 else ''} {', '.join(v)} on {n} wait{'' if len(v) > 1 else 's'} "
                               "in a collective too" for n, v in by_node.items()))
    nodes: dict[str, dict[str, Any]] = {}
    for r in jv.remote:
        n = nodes.setdefault(r.node, {"last_report": round(r.reported_at, 3), "stale": jv.remote_stale(r), "ranks": {}})
        n["ranks"][str(r.rank)] = {"pid": r.pid, "state": r.state, "waits": r.waits}
    for name, n in sorted(nodes.items()):
        if n["stale"]:
            ranks = ", ".join(sorted(n["ranks"], key=lambda x: int(x) if x.isdigit() else 1 << 30))
            parts.append(f"{name}: no report since {report.clock(n['last_report'])} (rank{'s' if len(n['ranks']) > 1 else ''} "
                         f"{ranks} not judged)")
    inc.evidence["nodes"] = nodes
    if remote_culprits:
        inc.evidence["remote_culprits"] = [{"rank": r.rank, "node": r.node, "pid": r.pid, "state": r.state,
                                            "reason": r.reason} for r in remote_culprits]
    # every culprit with its node (a pid means something only on its node)
    inc.evidence["culprits"] = [*({"rank": jv.job.ranks[p], "node": env.node(), "pid": p} for p in local_culprits),
                                *({"rank": r.rank, "node": r.node, "pid": r.pid} for r in remote_culprits)]
    inc.ranks = sorted({*inc.ranks, *(r.rank for r in jv.remote if r.rank is not None)})


def _culprits(env: Env, jv: JobView) -> tuple[list[int], list[Any]]:
    """The job's culprits: its ranks here (pids), and those on other nodes (their reports)."""
    job, tr = jv.job, jv.track
    new = _culprit(env, jv)
    alive = set(jv.live) | set(tr.exited)
    if new is not None and (tr.culprit is None or new.strength >= tr.culprit.strength
                            or not set(tr.culprit.pids) & alive):
        tr.culprit = new
    culprits = [p for p in (tr.culprit.pids if tr.culprit else []) if p in job.ranks]
    if job.spans_nodes:
        # a rank here blamed a moment ago that now waits in the collective with the others is not it
        culprits = [p for p in culprits if p not in jv.readings or not jv.readings[p].local.waits_for_peer]
    # a rank on another node stays the culprit while its node reports it outside a collective, or,
    # named by the flight recorder (it never entered the collective the others are in), while its
    # node reports at all
    fresh = {(r.node, r.rank): r for r in jv.remote_fresh}
    by_fr = tr.culprit is not None and tr.culprit.strength >= Strength.FLIGHT_RECORDER
    remote_culprits = [fresh[(r.node, r.rank)] for r in (tr.culprit.remote if tr.culprit else [])
                       if (r.node, r.rank) in fresh and (fresh[(r.node, r.rank)].waits is False or by_fr)]
    return culprits, remote_culprits


def _who_words(env: Env, jv: JobView, inc: Incident, culprits: list[int], remote_culprits: list[Any]) -> list[str]:
    """The summary's sentences on who: the culprits and what they do, the ranks that wait on them."""
    job, tr, readings = jv.job, jv.track, jv.readings
    waiters = jv.by_rank({p for p in tr.waiters if p in jv.live} - set(culprits))
    parts = []
    here = f" on {env.node()}" if job.spans_nodes and env.node() else ""  # ranks of a job on several nodes say where
    if culprits or remote_culprits:
        who = ", ".join([*(f"rank {job.ranks[p]}{here} (pid {p})" for p in culprits), *map(_remote_name, remote_culprits)])
        one = len(culprits) + len(remote_culprits) == 1
        basis = tr.culprit.basis if tr.culprit is not None else ""
        parts.append(f"{who} {'is' if one else 'are'} "
                     + (f"the likely culprit{'' if one else 's'}, where the ranks' collectives diverged: " if basis == "diverged"
                        else f"behind the others ({tr.culprit.source}): " if basis == "ras" and tr.culprit is not None
                        else f"not in the collective {'its' if one else 'their'} peers wait in: ")
                     + "; ".join([*(f"rank {job.ranks[p]}: {readings[p].why}" if p in readings
                                    else f"rank {job.ranks[p]}: exited at {report.clock(tr.exited[p])}"
                                    for p in culprits if p in readings or p in tr.exited),
                                  *(f"rank {r.rank} on {r.node}: {r.reading or r.reason or r.state}"
                                    for r in remote_culprits)]))
    if waiters:
        waited = jv.t - (inc.hang_started_at if inc.hang_started_at is not None else jv.last_progress)
        parts.append("; ".join(f"rank {job.ranks[p]} has waited {waited:.0f} s: {readings[p].why}"
                               for p in waiters if p in readings))
    if not culprits and not remote_culprits and not waiters:
        parts.append(f"no rank has progressed for {jv.quiet:.0f} s")
    if tr.culprit is not None and (tr.culprit.basis == "diverged" or not tr.culprit.pids and not tr.culprit.remote):
        parts.append(tr.culprit.source)  # what the evidence says of diverged collectives, a rank blamed or none
    return parts


def _culprit_details(env: Env, jv: JobView, inc: Incident, culprits: list[int]) -> list[str]:
    """Per culprit: its stack, a wait nothing ends, a thread it lost."""
    job, parts = jv.job, []
    for p in culprits:
        st = report.stack_brief(env.view, env.tracks.get(p), p)
        if st and st["frames"]:
            parts.append(f"rank {job.ranks[p]}'s stack: " + " <- ".join(st["frames"][:4]))
        s = jv.sigs.get(p)
        if s is not None and s.asleep_s is not None and stuck_in_own_wait(env, jv, p):
            parts.append(f"rank {job.ranks[p]}'s main thread has not woken for {s.asleep_s:.0f} s: a wait with no "
                         "timeout, that nothing of the job moves to end")
        if s is not None and s.threads_lost_at is not None and s.threads_lost_at >= (inc.hang_started_at or jv.t) - env.th.exception_lookback_s:
            parts.append(f"rank {job.ranks[p]} lost a thread at {report.clock(s.threads_lost_at)} "
                         f"({s.threads_before} -> {s.threads_after} threads)")
    return parts


def fill(env: Env, jv: JobView, inc: object) -> None:
    """The incident's people, summary, evidence and next step, from the job as it is now."""
    assert isinstance(inc, Incident)
    job, tr = jv.job, jv.track
    tr.waiters |= jv.waiting
    culprits, remote_culprits = _culprits(env, jv)
    inc.pids = list(job.pids)
    inc.ranks = [job.ranks[p] for p in job.pids]
    inc.culprit_pids = culprits
    inc.culprit_ranks = [job.ranks[p] for p in culprits] + [r.rank for r in remote_culprits if r.rank is not None]
    parts = _who_words(env, jv, inc, culprits, remote_culprits) + _culprit_details(env, jv, inc, culprits)
    # the newest: one of an earlier hang of the job names who was missing then
    missing = next((f for f in reversed(tr.findings) if f.kind == FindingKind.MISSING_RANK
                    and _of_this_stall(tr, f, jv.last_progress, env)), None)
    if missing is not None:
        parts.insert(0, "Flight recorder: " + missing.message)
    exc = report.exceptions(env.view, job, (inc.hang_started_at or jv.t) - env.th.exception_lookback_s)
    if exc:
        parts.insert(0, "Probable cause, from " + report.quote_exception(exc[-1]))
    inc.evidence = report.evidence(env.view, env.tracks, job, jv.sigs, jv.quiet)
    stalled = inc.hang_started_at if inc.hang_started_at is not None else jv.last_progress
    hw_parts, hw_ev = gpucause.hang(env.view, jv, stalled, {p: tr.stopped_at.get(p) or env.progress.of(p).last or stalled
                                                            for p in job.pids})
    parts[:0] = hw_parts  # the hardware's word on the GPU first: it outranks what the ranks do
    if hw_ev:
        inc.evidence["hardware"] = hw_ev
    if job.spans_nodes:
        _fleet(env, jv, inc, parts, culprits, remote_culprits)
    inc.summary = ". ".join(parts) + "."
    if exc:
        inc.evidence["exceptions"] = exc[-5:]
    if tr.culprit is not None:
        inc.evidence["culprit_from"] = tr.culprit.source
    inc.findings = [f.to_dict() for f in tr.findings]
    inc.evidence["flight_recorder"] = inc.findings
    base = inc.next_step.split(" Flight recording is off")[0].split(" " + DIVERGED_HINT)[0]
    if tr.culprit is not None and tr.culprit.basis == "diverged":
        base += " " + DIVERGED_HINT
    inc.next_step = base + (" " + report.FR_HINT if not tr.fr and report.flight_recording_off(env.view, job) else "")
    env.book.touch(inc, jv.t, f"culprit ranks {inc.culprit_ranks}" if inc.culprit_ranks else None)
