"""What the analysis asks the sources for next (stacks, native stacks, flight-recorder dumps, NCCL
RAS), from a job's view at one tick: the live daemon serves the asks, a replay has them recorded."""

from __future__ import annotations

from hangd.analysis.detectors import Env
from hangd.analysis.model import Local
from hangd.analysis.views import JobView


def ask_for_evidence(env: Env, jv: JobView) -> None:
    """Stacks of a job quiet for a while (again after a pause, and natively once hung), flight
    recorder dumps and RAS of a hung one, and one stack of a rank working on the CPU unexplained
    (``unexplained_cpu``)."""
    th = env.th
    tr, live, t = jv.track, jv.live, jv.t
    if not live:
        return
    # a rank on the CPU with no GPU work says what it does only in its stack (compiling, importing,
    # tokenizing, its own loop): one non-blocking capture, again while it stays so unexplained. A
    # stack that named nothing (its start-up imports, taken before the work now seen began: tracing
    # with torch.compile) is no answer: it is taken again stack_repeat_s later, then less and less often
    for p in live:
        tp = env.track(p)
        if tp.verdict.known:
            tp.cpu_stacks_unnamed = 0
        every = min(th.cpu_stack_every_s, th.stack_repeat_s * 2 ** tp.cpu_stacks_unnamed) \
            if tp.verdict_t is not None and not tp.verdict.known else th.cpu_stack_every_s
        if unexplained_cpu(env, jv, p) and (tp.verdict_t is None or t - tp.verdict_t >= every) \
                and (tp.cpu_stack_asked is None or t - tp.cpu_stack_asked >= every):
            tp.cpu_stack_asked = t
            tp.cpu_stacks_unnamed += not tp.verdict.known and tp.verdict_t is not None
            env.requests.stacks.append((p, False))
    if capturing(env, jv):
        env.capturing_jobs.add(jv.job.id)
    else:
        env.capturing_jobs.discard(jv.job.id)
    busy_phase_stacks(env, jv)
    probe_collectives(env, jv)
    if jv.quiet < th.stack_quiet_s:
        tr.stacks_asked = []
        tr.native_asked = tr.fr_hang_asked = False
        return
    if all(jv.readings[p].local == Local.BUSY for p in live):
        return
    asked = tr.stacks_asked
    if not asked or (len(asked) < 2 and t - asked[-1] >= th.stack_repeat_s) or t - asked[-1] >= th.stack_recapture_s:
        asked.append(t)
        del asked[:-4]
        env.requests.stacks.extend((p, False) for p in live)
    if tr.hung and not tr.native_asked:
        tr.native_asked = True
        env.requests.stacks.extend((p, True) for p in live)
        env.requests.ras = True
    # no dump while a capture may be open (see capturing()); asked at a later tick of the hang once
    # nothing says so any more
    if tr.hung and not tr.fr_hang_asked and jv.job.id not in env.capturing_jobs:
        tr.fr_hang_asked = True
        if tr.fr_asked is None or t - tr.fr_asked > th.fr_rerequest_s:
            tr.fr_asked = t
            env.requests.fr_dumps.extend(live)
            tell_ranks(env, jv)


def busy_phase_stacks(env: Env, jv: JobView) -> None:
    """A job whose ranks work on their GPUs says which phase it is in (CUDA graph capture,
    compiling, its model running) only in its stacks: one rank's, in turn, every
    ``busy_stack_every_s`` (non-blocking, like every capture), whatever the job's size."""
    th, tr, t = env.th, jv.track, jv.t
    busy = [p for p in jv.live if jv.readings[p].local in (Local.BUSY, Local.GRAPH_CAPTURE) and jv.sigs[p].gpu_indexes]
    if not busy or (tr.busy_stack_at is not None and t - tr.busy_stack_at < th.busy_stack_every_s):
        return
    tr.busy_stack_at = t
    tr.busy_stack_turn += 1
    env.requests.stacks.append((busy[tr.busy_stack_turn % len(busy)], False))


def probe_collectives(env: Env, jv: JobView) -> None:
    """Ranks wait in a collective for ranks that do no work: an idle server whose collectives keep
    completing (empty batches broadcast many times a second), or a hang in the making; or every
    rank waits in one, nothing else moving for ``stack_quiet_s``. A rank that
    waits spinning, on its GPU or its CPU, never wakes to show which: its flight recorder does. Its
    dumps are asked for every ``fr_probe_s`` while it is so (a dump does not stop the job)."""
    tr, t = jv.track, jv.t
    waiting = [p for p in jv.waiting if p in jv.live]
    if tr.hung or not waiting or jv.job.id in env.capturing_jobs:
        return
    # every rank in a collective and nothing else moves: slow collectives (many ranks over a socket
    # transport, a queue of hundreds) or a stall; their recorders tell which (completed seqs rising)
    if len(waiting) == len(jv.live) and (len(waiting) < 2 or jv.quiet < env.th.stack_quiet_s):
        return
    if any(not env.track(p).started for p in jv.live):
        return  # still starting: a server captures its CUDA graphs then, and the capture may begin any moment
    if any(jv.readings[p].local not in (Local.SPINNING, Local.WAITING, Local.QUIET, Local.SERVING) for p in jv.live):
        return  # a rank works (or loads, compiles, is stopped): the waits are for it
    if tr.fr_probed is None or t - tr.fr_probed >= env.th.fr_probe_s:
        tr.fr_probed = t
        env.requests.fr_probes.extend(jv.live)
        tell_ranks(env, jv)


# How a rank's number was known, on evidence of the process itself (identity._rank_of); start
# order and GPU index are guesses, and a dump asked under a guessed rank would be another's
KNOWN_RANK_SOURCES = ("process title or command line", "[rankN] prefix in its log", "flight-recorder dump")


def tell_ranks(env: Env, jv: JobView) -> None:
    """The ranks of the job known on evidence go with the dumps asked of them: the sources find a
    rank's dump pipe and files by its rank, which a server's schedulers have only as an argument."""
    job = jv.job
    env.requests.ranks.update({p: job.ranks[p] for p in jv.live
                              if p in job.ranks and job.rank_source.get(p) in KNOWN_RANK_SOURCES})


def capturing(env: Env, jv: JobView) -> bool:
    """A rank of the job may be capturing CUDA graphs: one reads so, its newest stack shows the
    capture (however old: ranks stuck in a capture's barrier stay in it), or the newest phase its
    own log named is the capture, within ``job_phase_s`` or with nothing of the job progressing
    since (a job hung in its capture). No flight-recorder dump is asked for then: the dump
    thread queries CUDA events, which a capture in the default (global) mode forbids, and the
    capture fails with ``cudaErrorStreamCaptureInvalidated``, killing the rank (seen on an H100
    with torch 2.11). A dump is evidence; the job comes first."""
    th, t = env.th, jv.t
    _, strong = env.progress.job_last(jv.live)
    for p in jv.live:
        tp = env.track(p)
        if jv.readings[p].local == Local.GRAPH_CAPTURE or "graph_capture" in jv.sigs[p].log_kinds:
            return True
        if tp.verdict.kind == "graph_capture":
            return True
        phase = jv.sigs[p].log_phase
        if phase is not None and phase[0] == "graph_capture" and (
                t - phase[1] <= th.job_phase_s or strong is None or strong <= phase[1] + th.window_s):
            return True
    return False


def unexplained_cpu(env: Env, jv: JobView, pid: int) -> bool:
    """On the CPU with nothing but its CPU and a trickle of bytes or a log line to show for it: a
    core in use (``Local.CPU``), or read busy on the CPU alone with no GPU work of its own (a gloo
    rank, a rank tracing with torch.compile before any compiler runs)."""
    loc, s = jv.readings[pid].local, jv.sigs[pid]
    return loc == Local.CPU or (loc == Local.BUSY and not s.gpu.any_work()
                                and (s.cpu_cores or 0) >= env.th.cpu_active_cores)
