"""Job facts: what the ranks of one job show together at one tick, over the job's view and each
rank's last stack (plain records: no engine, no /proc)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from hangd.analysis.model import Local
from hangd.analysis.progress import Progress
from hangd.analysis.signals import ProcSignals
from hangd.analysis.thresholds import Thresholds
from hangd.analysis.views import JobView, ProcTrack

# Stack verdicts of a rank inside one of its job's collectives, or waiting for its GPU to finish
# them (CUDA's synchronize after a queue of collectives).
IN_COLLECTIVE = ("collective", "gpu_sync", "backward")
# Where a collective's wait is entered: torch.distributed's calls, autograd's backward (DDP's
# all-reduce), CUDA's synchronize.
_WAIT_CALLS = ("torch/distributed/distributed_c10d.py:", "torch/autograd/", "torch/cuda/")


def _in_torch(frame_key: str) -> bool:
    return frame_key.startswith("torch/") or "/torch/" in frame_key


def wait_site(tp: ProcTrack) -> str | None:
    """Where its last Python stack waits on its job's collectives: the innermost torch call that
    waits (``all_reduce``, ``barrier``, ``synchronize``, ``backward``) and the first caller outside
    torch, with its line (``synchronize from matrix_job.py:warmup:583``); None when its stack is in
    none (or names no Python frame)."""
    if tp.verdict_t is None or tp.verdict.kind not in IN_COLLECTIVE:
        return None
    frames = list(tp.stack_sig)  # innermost first, "file:name:line"
    for i, key in enumerate(frames):
        if key.startswith(_WAIT_CALLS) or any(f"/{c}" in key for c in _WAIT_CALLS):
            caller = next((f for f in frames[i + 1:] if not _in_torch(f)), "")
            return f"{key.split(':')[1]} from {caller.rsplit('/', 1)[-1]}" if caller else key.split(":")[1]
    return None


def every_rank_in_one_wait(jv: JobView, tracks: Mapping[int, ProcTrack], within_s: float) -> tuple[bool, str]:
    """Every rank of the job is here, runs, and waits at the same collective call site, on stacks
    taken since the job last progressed (``within_s`` of slack): no rank is elsewhere, stopped,
    gone or on another node, so none is the one the others wait for. Their collectives run (slowly:
    many ranks over a socket transport, a queue of hundreds) or the transport itself stalls; the
    stacks cannot tell which, so it is no evidence of a rank that holds the others up."""
    job, live = jv.job, jv.live
    if len(live) < 2 or job.spans_nodes or jv.remote or jv.track.exited or set(live) != set(job.ranks):
        return False, ""
    if job.world_size is not None and job.world_size != len(live):
        return False, ""
    if any(p not in jv.waiting for p in live):
        return False, ""
    sites: set[str] = set()
    for p in live:
        tp = tracks.get(p)
        site = wait_site(tp) if tp is not None else None
        if site is None or tp is None or tp.verdict_t is None or tp.verdict_t < jv.last_progress - within_s:
            return False, ""
        sites.add(site)
    if len(sites) != 1:
        return False, ""
    return True, f"every rank of the job waits at the same call ({sites.pop()}): none is missing from it"


def capture_logged_over(jv: JobView) -> tuple[float | None, str]:
    """When a rank's own log last said its CUDA graph capture ended ("Capture cuda graph end"),
    with no capture line after it, and which rank said so; None when none did. Tensor-parallel
    ranks capture together, and often one of them logs it."""
    best: tuple[float, int] | None = None
    for p in jv.live:
        ph = jv.sigs[p].log_phase
        if ph is not None and ph[0] == "graph_capture_end" and (best is None or ph[1] > best[0]):
            best = (ph[1], p)
    if best is None:
        return None, ""
    return best[0], f"rank {jv.job.ranks.get(best[1], '?')}'s log said its CUDA graph capture ended"


def recent_completions(entries: Sequence[Any], pgs: Collection[str], t: float, within_s: float) -> tuple[float, float] | None:
    """Collectives one flight-recorder dump shows completing just before ``t``: (when the newest
    completed, how many a second over ``within_s``), or None. An entry's completion time where the
    recorder timed it, else its creation time (a completed entry completed no earlier). Only the
    groups ``pgs`` (all when empty): a side group's health check says nothing of the group a rank
    waits in. One dump is enough: a first dump of a server polling in its broadcasts shows the
    last ones done a moment ago, before a second dump can be compared with it."""
    times = sorted(x / 1e9 for e in entries if e.completed and (not pgs or e.pg in pgs)
                   and (x := e.time_completed_ns or e.time_created_ns))
    recent = [x for x in times if t - within_s <= x <= t]
    if len(recent) < 2:
        return None
    return recent[-1], (len(recent) - 1) / max(recent[-1] - recent[0], 1e-3)


def collectives_completing(p: Progress, s: ProcSignals, last_wait: str | None, t: float, th: Thresholds,
                           work: float | None) -> float | None:
    """How many a second a rank's collectives complete while it waits in one, or None: its main
    thread keeps waking inside the collective (``wake_per_s``), or its flight recorder's last dump
    caught them completing (``caught_completing``) within ``collectives_seen_s`` and after ``work`` (the job's last work,
    when given: collectives that completed while ranks worked are the work's own). A dump is a
    sample: what it showed holds until the next one says otherwise or ``collectives_seen_s``
    passes (a rank that waits spinning on its GPU or its CPU never wakes)."""
    if last_wait == "collective" and (s.wakes_per_s or 0) >= th.wake_per_s:
        return s.wakes_per_s
    if p.collectives_at is not None and t - p.collectives_at <= th.collectives_seen_s and p.collectives_per_s \
            and (work is None or p.collectives_at > work) and caught_completing(p, th):
        return p.collectives_per_s
    return None


def caught_completing(p: Progress, th: Thresholds) -> bool:
    """The dump that last showed its collectives completing caught them at it: the newest had
    completed within ``window_s`` of the dump's coming (a few of their intervals at least). One
    whose newest completion was older shows collectives that completed, then stopped (a hang that
    began between two dumps)."""
    if p.collectives_at is None or p.collectives_seen_at is None:
        return p.collectives_at is not None
    gap = max(th.window_s, 3.0 / p.collectives_per_s) if p.collectives_per_s else th.window_s
    return p.collectives_seen_at - p.collectives_at <= gap


def still_since(jv: JobView, at: float, window_s: float) -> tuple[bool, str]:
    """Every rank left has done nothing since ``at`` (a peer's exit): none progressed after it (past
    one window, whose rates still show what came before), and each reads a wait for a peer or
    silence (asleep, nothing moving: a wait no stack has shown yet). What a rank killed mid-step
    leaves: its peers block in the collective or the store it never joins, and no stack need come
    before they give up."""
    if not jv.live or (jv.last_strong is not None and jv.last_strong > at + window_s):
        return False, ""
    if not all(jv.readings[p].local.waits_for_peer or jv.readings[p].local == Local.QUIET for p in jv.live):
        return False, ""
    return True, f"no rank left has progressed since, each waits or sleeps ({jv.t - at:.0f} s)"

