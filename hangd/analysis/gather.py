"""The evidence record of each rank (what ``rankstate.decide`` judges), gathered from the engine's
views at one tick: what each source says moved, what the rank waits on, what its job says.

These read the analyzer's state (its node view, progress book, tracks and incidents), and the
marks of setting up that ``history`` keeps; they decide nothing themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from hangd.analysis import history, otherend, rankstate, stackcat
from hangd.analysis.detectors import Env, hang, orphan
from hangd.analysis.facts import io
from hangd.analysis.facts import job as job_facts_mod
from hangd.analysis.model import Local, Reading, State
from hangd.analysis.signals import ProcSignals
from hangd.analysis.views import JobView, ProcTrack

# Readings that show no more than a core in use or silence: a state shown on them alone is a guess.
GUESSED = (Local.CPU, Local.QUIET)
# Kernel wait points of a sleep in the process's own code (time.sleep), not a block on something.
SLEEP_WCHANS = ("hrtimer_nanosleep", "do_nanosleep", "clock_nanosleep", "common_nsleep")


def job_facts(env: Env, jv: JobView) -> dict[str, Any]:
    """What the job says at this tick, the same for each of its ranks."""
    th = env.th
    job, tr, t = jv.job, jv.track, jv.t
    waiting, serving = jv.waiting, jv.serving
    hinc = env.book.get(job.id, hang.FAMILY)
    hung_why = ""
    hung_ref = f" (incident #{hinc.id} {hinc.kind})" if hinc else ""
    if tr.hung:
        hung_why = f"job hung: no rank has progressed for {jv.quiet:.0f} s"
    exited = hinc is not None and hinc.kind == "rank_exited" and not tr.hung
    if exited:
        assert hinc is not None
        hung_why = f"job hung: rank {', '.join(map(str, hinc.culprit_ranks))} exited and the others wait for it"
    idle, idle_why = jv.idle
    # a pattern: at least two earlier waits in the window (one earlier blip is not one)
    recurring = tr.episode is not None and sum(
        1 for tt, c in tr.episodes
        if tr.episode_start - th.straggler_window_s <= tt < tr.episode_start - 0.5 and c == tr.episode) >= th.straggler_recurring
    # a rank the waiting ones wait for is working: they wait for a peer that works (not one that
    # only logged a line since they wait, and now sleeps or sits on idle workers of its own)
    # the wait began when the waiting ranks last progressed, if that was before a stack showed it
    # (captures are seconds apart): what a peer did in between was done while they waited
    began = min([tr.episode_start] + [x for w in waiting if (x := env.progress.of(w).last) is not None])
    # every rank waits: there is no peer working to wait for (a pattern of such waits is the job's
    # own collectives, each rank in them a moment; one that lasts is a hang in the making)
    everyone = bool(waiting) and waiting >= set(jv.live)
    # when each peer last progressed, for those that did more than log since the wait began
    worked = [x for o in jv.live if o not in waiting
              if (x := env.progress.of(o).last) is not None and x > began and not only_logged(env, o, jv, began)]
    peer_works = any(t - x <= th.progress_recent_s for x in worked)
    # a peer went on working a while after the wait began: the wait was for that work, not a hang's
    # first moment, and stays a wait for a peer (not held) when the peer then stops
    peer_worked = any(x > began + th.peer_worked_s for x in worked)
    at_work, at_work_why = collectives_at_work(env, jv)
    one_wait, one_wait_why = job_facts_mod.every_rank_in_one_wait(jv, env.tracks, th.window_s) \
        if jv.quiet < th.hang_all_in_s else (False, "")
    capturing, capture_why = job_captures(env, jv)
    return {"hung": tr.hung, "exited": exited, "hung_why": hung_why, "at_work": at_work, "at_work_why": at_work_why,
            "one_wait": one_wait, "one_wait_why": one_wait_why,
            "capturing": capturing, "capture_why": capture_why, "hung_ref": hung_ref, "idle": idle, "idle_why": idle_why,
            # a wait read off the GPU may be a blip; any wait while nothing moves may be a hang in
            # the making; a wait for a peer that works is waiting_peer at once
            # ... and so may a rank's silence once a rank of its job exited: it may wait for that one
            # in a way no stack has shown yet
            "hold": (bool(waiting) or bool(tr.exited)) and (not recurring or everyone) and (
                (bool(jv.spinning) and t - tr.episode_start < (th.hang_gpu_s if not peer_works else 2 * th.dwell_s))
                or (not peer_works and jv.quiet < 2 * th.hang_host_s)),
            "waiting": waiting, "serving": serving, "peer_worked": peer_worked}

def job_captures(env: Env, jv: JobView) -> tuple[bool, str]:
    """Its job captures CUDA graphs: a rank's stack showed the capture within ``job_phase_s``, or
    a rank's own log named it within ``log_recent_s`` ("Capturing batches"). Tensor-parallel ranks
    capture together, a barrier between batch sizes, and usually one of them logs it. Not while
    a rank is out of it (asleep in a wait of its own, stopped): the others then wait for that one."""
    t, th = jv.t, env.th
    if any(jv.readings[p].local not in rankstate.CAPTURING for p in jv.live):
        return False, ""
    ended, _ = job_facts_mod.capture_logged_over(jv)
    for p in jv.by_rank(jv.live):
        tp = env.track(p)
        if tp.verdict.kind == "graph_capture" and tp.verdict_t is not None and t - tp.verdict_t <= th.job_phase_s \
                and (ended is None or tp.verdict_t > ended):
            return True, f"rank {jv.job.ranks[p]}'s stack {t - tp.verdict_t:.0f} s ago shows it capturing ({tp.verdict.frame})"
        if "graph_capture" in jv.sigs[p].log_kinds:
            return True, f"rank {jv.job.ranks[p]}'s log says it captures CUDA graphs"
    return False, ""


def collectives_at_work(env: Env, jv: JobView) -> tuple[bool, str]:
    """Every rank reads a wait for a peer, and every rank has itself progressed within
    ``window_s`` (its own log, its GPU's work, its stack moving): the ranks are in their own
    collectives as they work (a pipeline's sends and receives, back-to-back all-reduces), each a
    moment, not waiting on one that stopped. Any number of ranks; one that stops progressing,
    or leaves the collective for a wait of its own, ends it."""
    live, t, th = jv.live, jv.t, env.th
    if len(live) < 2 or any(not jv.readings[p].local.waits_for_peer for p in live):
        return False, ""
    lasts = [env.progress.of(p).last_strong for p in live]
    if any(x is None or t - x > th.window_s for x in lasts):
        return False, ""
    return True, f"every rank is in a collective and every rank progresses ({env.progress.why_strongest(live)})"


def only_logged(env: Env, pid: int, jv: JobView, since: float) -> bool:
    """Nothing of its work moved since ``since`` but its log (a burst of bytes, a wake-up aside),
    and it does nothing now: asleep with no wait a stack or descriptor names, or blocked on workers
    of its own none of which works (a server that logs the request it takes, then sleeps in it). A
    rank that worked and stopped (its GPU's last kernels, its bytes written) is not one."""
    s, loc = jv.sigs[pid], jv.readings[pid].local
    idle = loc == Local.QUIET or loc == Local.WORKER_WAIT and not env.view.workers_work(pid, jv.job.ranks, jv.t)
    strong = env.progress.of(pid).last_strong
    return idle and (strong is None or strong <= since or s.log_grew_at is not None and s.log_grew_at >= strong)

def idle_server(env: Env, jv: JobView) -> tuple[bool, str]:
    """An idle server: ranks wait for one that waits for requests from outside the job, or the
    ranks' collectives keep completing while none of them works and they carry next to no data
    (a scheduler polling an empty queue and broadcasting empty batches many times a second; a
    warm-up's all-reduces complete as often, with their bytes moving: ``io.moves_now``)."""
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
    work = env.progress.job_last_work(live)
    if work is not None and t - work <= env.th.stack_quiet_s:
        return False, ""  # something does work: the waits are for it
    if any(io.moves_now(jv.sigs[p], env.th) for p in live):
        return False, ""  # bytes move: collectives that carry data, not an idle server's empty batches
    completing = [r for p in waiting if (r := collectives_complete(env, p, jv, work)) is not None]
    if not completing:
        return False, ""
    coord = ", ".join(str(job.ranks[o]) for o in jv.by_rank(others))
    return True, (f"idle server: the collectives with rank {coord} keep completing "
                  f"({max(completing):.0f} a second) and no rank works")

def collectives_complete(env: Env, pid: int, jv: JobView, work: float | None) -> float | None:
    """``facts.job.collectives_completing`` of this rank at this tick."""
    s = jv.sigs[pid]
    return job_facts_mod.collectives_completing(env.progress.of(pid), s, env.last_wait(pid, s, jv.t), jv.t, env.th, work)

def evidence(env: Env, pid: int, jv: JobView, facts: dict[str, Any], orphaned: bool) -> rankstate.Evidence:
    """The record ``rankstate.decide`` judges: per source whether the rank moved, what it
    waits on, what its job says."""
    job, t = jv.job, jv.t
    s, rd, p = jv.sigs[pid], jv.readings[pid], env.track(pid)
    waiting, serving = facts["waiting"], facts["serving"]
    progress, how = progress_record(env, pid, s, t, job.ranks)
    waiting_on, detail = waits_on(env, pid, jv)
    loc = rd.local
    # peers in a collective (a rank that waits in its start-up's rendezvous waits for the job to
    # form, for no one rank)
    peers = [w for w in waiting if w != pid and not store_wait(env, w)]
    peers_wait = ", ".join(str(job.ranks[w]) for w in jv.by_rank(peers)) \
        if peers and pid not in waiting and pid not in serving else ""
    waited = jv.by_rank([o for o in jv.live if o != pid and o not in waiting]) if loc.waits_for_peer else []
    it_waits_for = ", ".join(str(job.ranks[o]) for o in waited)
    stopped_peers = ", ".join(str(job.ranks[o]) for o in waited if jv.readings[o].local == Local.STOPPED)
    worker_stuck = loc == Local.WORKER_WAIT and not env.view.workers_work(pid, job.ranks, t)
    job_hung = facts["hung"] or (facts["exited"] and loc not in (Local.BUSY, Local.LOADING, Local.WRITING, Local.COMPILING))
    why = rd.why
    held = shown_at_progress(env, pid, t)
    over = compile_over(held[0], loc)
    if held[0] == State.COMPILING and ran_after_compile(p) and not over:
        # a stack after the compile showed it at work (the dwell had not yet said so): a first wait
        # keeps that work, not the compile
        held = (State.BUSY, f"done compiling; its stack after the compile: {p.verdict.why} ({p.verdict.frame})")
    if held[0] == State.GRAPH_CAPTURE:
        ended, ended_why = job_facts_mod.capture_logged_over(jv)
        if ended is not None:
            # the capture it was shown in is over: what it waits in since is the work after it
            held = (State.BUSY, f"done capturing: {ended_why}")
    return rankstate.Evidence(
        local=loc, why=why, progress=progress, how=how, waits_on=waiting_on, waits_detail=detail,
        # once set up, it stays so: what first_evidence looks for (and keeps) no longer matters
        started=p.started, first_evidence=not p.started and first_evidence(env, pid, jv), previous=held[0],
        why_previous=held[1],
        orphaned=orphaned, orphan_why=orphan.reason(env.view, pid) if orphaned else "",
        job_hung=job_hung, hung_why=facts["hung_why"], hung_ref=facts["hung_ref"], age_s=s.age_s,
        idle_server=facts["idle"] and not worker_stuck, idle_why=facts["idle_why"],
        collectives_at_work=facts["at_work"], at_work_why=facts["at_work_why"],
        one_wait=facts["one_wait"], one_wait_why=facts["one_wait_why"],
        job_captures=facts["capturing"], capture_why=facts["capture_why"],
        # a wait on its own workers that do not move keeps what it did before, as a first wait for a
        # peer does, until the job is judged hung or the wait outlasts the hang threshold twice
        hold=(facts["hold"] and not (pid in waiting and facts["peer_worked"])
              or (worker_stuck and jv.quiet < 2 * env.th.hang_host_s))
        and not over and not waits_for_the_gone(jv, loc),
        peers_wait_for_it=peers_wait, it_waits_for=it_waits_for, waits_for_stopped=stopped_peers)

def store_wait(env: Env, pid: int) -> bool:
    """Its wait is on the rendezvous store (its stack or its descriptors say so), not in a collective."""
    p = env.track(pid)
    return p.verdict.kind == "store" or (p.other_end is not None and p.other_end.store)

def shown_at_progress(env: Env, pid: int, t: float) -> tuple[State | None, str]:
    """The state a hold keeps: the one it was shown in when it last progressed. A state shown since
    on nothing but its CPU or its silence was a guess made before a stack showed the wait (captures
    are seconds apart): a loader whose reads end as it enters a collective that spins a core was
    loading when the wait began, not busy. A state shown since on evidence (a stack, its
    descriptors, its GPU) stands."""
    p = env.track(pid)
    last = env.progress.of(pid).last
    if last is None or p.state is None or p.since <= last:
        return p.state, p.reason
    for since, state, reason, loc in reversed(p.shown):
        if since > last and loc in GUESSED:
            continue
        if since <= last and state != State.STARTING:  # still setting up then: what it shows now
            return state, f"{reason} ({t - last:.0f} s ago, when it last progressed)"
        if state != State.STARTING:
            return state, reason
        break
    return p.state, p.reason


def waits_for_the_gone(jv: JobView, loc: Local) -> bool:
    """A wait in a collective or the store, shown by its stack or descriptors, in a job a rank of
    which has exited: no blip of a step that the next moment ends (the rank it pairs with is
    gone), so it is not held."""
    return loc == Local.WAITING and bool(jv.track.exited)


def compile_over(previous: State | None, loc: Local) -> bool:
    """A rank said to compile whose stack now shows it waiting for a peer (a collective, the store)
    has finished compiling: keeping "compiling" through a first wait would say it still works."""
    return previous == State.COMPILING and loc == Local.WAITING


def ran_after_compile(p: ProcTrack) -> bool:
    """Its newest stack, taken after its last compiling one, shows its compiled model running (a
    wait or a lock there is no work to keep)."""
    return p.verdict.kind == "computing" and p.verdict_t is not None and p.compiled_at is not None \
        and p.verdict_t > p.compiled_at


def progress_record(env: Env, pid: int, s: ProcSignals, t: float,
                    ranks: Collection[int]) -> tuple[dict[str, rankstate.Moved], dict[str, str]]:
    th = env.th
    M = rankstate.Moved
    out: dict[str, rankstate.Moved] = {}
    how: dict[str, str] = {}

    def put(src: str, known: bool, moved: bool, words: Callable[[], str]) -> None:
        # the words only for what moved: most sources of most ranks move at no tick
        out[src] = M.UNKNOWN if not known else (M.YES if moved else M.NO)
        if moved:
            how[src] = words()

    g = s.gpu
    put("gpu_work", bool(s.gpu_indexes) and g.util is not None, g.works(th), lambda: "its GPU works")
    put("cpu_own_code", s.cpu_cores is not None, (s.cpu_cores or 0) >= th.busy_cpu_cores,
        lambda: f"on CPU ({s.cpu_cores or 0:.1f} cores)")
    put("read", s.in_long_per_s is not None, io.moves(s, th, "in"),
        lambda: f"read {(s.in_long_per_s or 0) / 1e6:.0f} MB/s ({s.in_counter})")
    put("write", s.out_long_per_s is not None, io.moves(s, th, "out"),
        lambda: f"wrote {(s.out_long_per_s or 0) / 1e6:.0f} MB/s ({s.out_counter})")
    put("log", True, s.log_grew_at is not None and t - s.log_grew_at <= th.window_s, lambda: "wrote to its log")
    put("collectives", s.wakes_per_s is not None, env.last_wait(pid, s, t) == "collective"
        and (s.wakes_per_s or 0) >= th.wake_per_s, lambda: "its collectives complete")
    p = env.track(pid)
    put("stack", p.stack_sig_t is not None, bool(p.stack_sig_t and env.progress.of(pid).why.startswith("its stack")
                                                 and t - (env.progress.of(pid).last or 0) <= th.window_s),
        lambda: "its stack changed")
    kids = env.view.workers(pid, ranks)
    busy = [c for c in kids if env.view.cpu_works(c, t)]
    put("children", bool(kids), bool(busy), lambda: f"its workers pid {', '.join(map(str, busy[:4]))} work")
    return out, how

def still_for(env: Env, pid: int, t: float) -> float | None:
    """How long it has used no CPU, over the history kept (None: it used some at the last reading)."""
    samples = env.view.procs[pid].samples
    if not samples:
        return None
    last_t, last = samples[-1]
    if last.utime is None or last.stime is None:
        return None  # its CPU time was not read: unknown, not still
    since = None
    for st, sp in reversed(samples):
        if (sp.utime, sp.stime) != (last.utime, last.stime):
            break
        since = st
    return t - since if since is not None and since < last_t else None


def _moved_at(env: Env, pid: int, t: float, still_s: float | None) -> float:
    """When a worker last moved: now if it runs (a wake-up shows in its switches only once it
    sleeps again), else its main thread's last wake-up (kept however long ago), else its CPU
    time's last change within the readings kept."""
    h = env.view.procs[pid]
    lp = h.latest()
    if lp is not None and lp.state == "R":
        return t
    return h.woke_at if h.woke_at is not None else t - (still_s or 0.0)


def waits_on(env: Env, pid: int, jv: JobView) -> tuple[rankstate.WaitsOn, str]:
    """What it waits on, and for a worker of its own which one and what that one does."""
    W = rankstate.WaitsOn
    rd = jv.readings[pid]
    loc = rd.local
    if loc in (Local.SPINNING, Local.WAITING):
        return W.PEER, ""
    if loc == Local.STOPPED:
        return W.STOPPED, ""
    oe = env.track(pid).other_end  # as the engine read it this tick (Analyzer._context)
    if loc == Local.SERVING:
        return W.OUTSIDE, oe.what if oe is not None and oe.kind == otherend.OUTSIDE else ""
    if loc == Local.WORKER_WAIT and oe is not None and oe.kind == otherend.OWN_THREAD:
        return W.OWN_WORKER, "a thread of its own"
    if loc == Local.WORKER_WAIT:
        mine = env.view.workers(pid, jv.job.ranks)
        if oe is not None and oe.kind == otherend.OWN_WORKER and oe.pids and not set(oe.pids) & set(mine):
            return W.OWN_WORKER, oe.what  # its launcher, or another process of its job: not a worker of its own
        held = [p for p in oe.pids if p in env.view.procs] if oe is not None and oe.kind == otherend.OWN_WORKER \
            else []
        # the holders its descriptors named (a bounded read may miss some) and its other workers,
        # the one that has not moved longest first: a DataLoader's workers all hold its result
        # pipe, and the one blocked is the one that matters
        kids = held + [c for c in mine if c not in held]
        if not kids:
            return W.OWN_WORKER, "a thread of its own"
        still = {c: still_for(env, c, jv.t) for c in kids}
        kids.sort(key=lambda c: (env.view.cpu_works(c, jv.t), _moved_at(env, c, jv.t, still[c])))
        words = []
        for c in kids[:3]:
            lp = env.view.procs[c].latest()
            if lp is None:
                continue
            still_s = still[c]
            asleep = lp.state in ("S", "D") and lp.wchan and lp.wchan != "0"
            doing = "working" if env.view.cpu_works(c, jv.t) else \
                f"sleeping in {lp.wchan}" + (f" for {still_s:.0f} s" if still_s is not None and still_s >= 1 else "") \
                if asleep else f"state {lp.state}"
            words.append(f"pid {c} ({doing})")
        name = "DataLoader worker" if any("dataloader" in f for f in env.track(pid).stack_sig) else "worker"
        return W.OWN_WORKER, f"its {name}{'s' if len(kids) > 1 else ''} " + ", ".join(words) + \
            (f" and {len(kids) - 3} more" if len(kids) > 3 else "")
    kind = env.track(pid).verdict.kind
    if kind == "lock_wait":
        return W.LOCK, ""
    if kind == "sleeping":
        return W.SLEEP, ""
    if loc in (Local.QUIET, Local.CPU, Local.IO_WAIT):
        return W.UNKNOWN, ""
    return W.NOTHING, ""

def first_evidence(env: Env, pid: int, jv: JobView) -> bool:
    """Setting up ends with the first sign of what the process is for, whatever its age: GPU
    work, memory beyond a CUDA context, loading, writing, capture, compiling, a wait, a request
    loop, a stack that says where it is, CPU work of its own once the imports are over (its GPU
    context exists, or past the setup window), or sleeping a few seconds after its setup."""
    th = env.th
    p = env.track(pid)
    s = jv.sigs[pid]
    loc = jv.readings[pid].local
    t = jv.t
    working = loc in history.WORKING
    pg_up = history.group_up(env, pid)
    if loc == Local.WAITING and store_wait(env, pid):
        return False  # the rendezvous of its start-up: still setting up (a hang says itself)
    if loc == Local.COMPILING and p.verdict.kind == "compile_setup" and not s.compile_children and not pg_up:
        return False  # torch.compile() importing its compiler during start-up: still setting up
    if loc in (Local.SERVING, Local.SPINNING, Local.WAITING, Local.WORKER_WAIT, Local.GRAPH_CAPTURE,
               Local.COMPILING, Local.STOPPED):
        return True
    if loc == Local.BUSY and s.gpu.works(th):
        return True
    fresh = p.verdict_t is not None and t - p.verdict_t <= th.stack_repeat_s
    # its process group is up (gloo's or NCCL's threads run: imports and init are over) and kernels run
    # on its GPU: set up, whatever it does next (CPU alone is no proof once NCCL may run: a rank
    # spinning in a barrier burns a core too); a rank without a GPU (gloo on the CPU), or a GPU rank
    # with no communicator yet, working on the CPU with its process group up: its imports are over
    dist_up = pg_up and ((s.gpu.util or 0) >= th.gpu_active_util_pct or (not s.gpu_indexes and loc in (Local.CPU, Local.BUSY))
                         or own_cpu_before_nccl(env, pid, jv))
    moving = loc in (Local.LOADING, Local.WRITING) and (bool(s.gpu_indexes) or s.age_s >= th.startup_imports_s) \
        and t - (p.working_since or t) >= th.startup_work_s
    if working and (fresh and p.verdict.known and p.verdict.kind not in stackcat.SLEEPING_KINDS or s.age_s >= th.startup_cpu_s or moving or dist_up):
        # its own code (a stack says so), past the imports, moving data faster than imports do, or
        # driving its GPU with its process group up
        return True
    if s.gpu_mem >= th.started_gpu_mem_bytes and loc == Local.QUIET and s.wchan in SLEEP_WCHANS:
        return True  # set up (its memory is in) and asleep in a loop of its own: idle, not blocked
    if loc == Local.QUIET and p.verdict.known and p.verdict_t is not None:
        return True
    if p.quiet_since is not None and (t - p.quiet_since >= th.startup_quiet_s and s.age_s >= th.startup_quiet_s
                                      or s.age_s >= th.startup_cpu_s + th.startup_quiet_s):
        return True
    return s.age_s >= th.startup_max_s


def own_cpu_before_nccl(env: Env, pid: int, jv: JobView) -> bool:
    """A GPU rank whose process group is up (init is over), on the CPU for ``startup_work_s`` with
    its GPU holding the same memory all that time and nothing more since the group came up: no NCCL
    communicator exists yet (one brings hundreds of MB of buffers and kernels), so no collective
    can hold it spinning, and what burns its CPU is its own code (building its model or its data,
    the lazy imports of its first step)."""
    th, t = env.th, jv.t
    p, loc = env.track(pid), jv.readings[pid].local
    if p.pg_up_mem is None or p.pg_mem_grew or p.gpu_mem_mark is None or p.working_since is None:
        return False
    held_since, held = p.gpu_mem_mark
    return held > 0 and t - held_since >= th.startup_work_s and loc in (Local.CPU, Local.BUSY) \
        and t - p.working_since >= th.startup_work_s


def name_workers(env: Env, jv: JobView) -> None:
    """A rank blocked on a worker of its own says which one and what that one does, in its reading
    (what incidents quote): "its DataLoader worker pid 4242 (sleeping in futex_wait)"."""
    for pid, rd in list(jv.readings.items()):
        if rd.local == Local.WORKER_WAIT:
            _, detail = waits_on(env, pid, jv)
            if detail and detail.split(":")[0] not in rd.why:
                jv.readings[pid] = Reading(rd.local, f"{rd.why}: {detail}")
                env.tracks[pid].reading = jv.readings[pid]
