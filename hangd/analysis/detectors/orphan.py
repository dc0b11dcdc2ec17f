"""Leftover GPU memory: ranks that lost their launcher and still hold GPU memory
(``orphaned_gpu_memory``), and GPU memory no visible process holds (another PID namespace, a
leaked context)."""

from __future__ import annotations

from hangd.analysis.detectors import Env
from hangd.analysis.nodeview import NodeView
from hangd.analysis.thresholds import GiB
from hangd.analysis.views import JobView
from hangd.incidents import Family, IncidentKind

FAMILY = Family.ORPHAN


def is_orphaned(view: NodeView, pid: int) -> bool:
    h = view.procs[pid]
    lp = h.latest()
    if lp is None or h.first_ppid is None or h.first_ppid <= 1:
        return False
    parent = view.procs.get(h.first_ppid)
    parent_gone = parent is None or parent.gone_at is not None or \
        ((plp := parent.latest()) is not None and plp.state == "Z")
    return (lp.ppid != h.first_ppid and parent_gone) or (parent is not None and parent.gone_at is not None)


def reason(view: NodeView, pid: int) -> str:
    h = view.procs[pid]
    lp = h.latest()
    return f"its launcher (pid {h.first_ppid}) is gone; re-parented to pid {lp.ppid if lp else '?'}"


def step(env: Env, jv: JobView, orphans: set[int]) -> None:
    view, job, t = env.view, jv.job, jv.t
    inc = env.book.get(job.id, FAMILY)
    sigs = jv.sigs
    holding = jv.by_rank({p for p in orphans if (s := sigs.get(p)) is not None and s.gpu_mem > 0})
    zombies = [p for p in job.pids if (h := view.procs.get(p)) and h.zombie_since and t - h.zombie_since >= env.th.orphan_gpu_s
               and p in view.gpu_of and t - view.gpu_seen_at.get(p, -1e9) < env.th.orphan_gpu_s]
    holding += [p for p in zombies if p not in holding]
    if holding and inc is None:
        inc = env.book.open_incident(IncidentKind.ORPHANED_GPU_MEMORY, job.id, t)
    if inc is None:
        return
    if not holding:
        env.book.resolve(inc, t, "the orphaned processes are gone and their GPU memory is free")
        return

    def held(p: int) -> int:
        s = sigs.get(p)
        return s.gpu_mem if s is not None else sum(v or 0 for v in view.gpu_of.get(p, {}).values())

    total = sum(held(p) for p in holding)
    inc.pids = list(job.pids)
    inc.ranks = [job.ranks[p] for p in job.pids]
    inc.culprit_pids = holding
    inc.culprit_ranks = [job.ranks[p] for p in holding]
    inc.summary = (f"{len(holding)} process{'es' if len(holding) > 1 else ''} of job {job.name} hold "
                   f"{total / GiB:.1f} GiB of GPU memory after losing their launcher: "
                   + ", ".join(f"pid {p} (rank {job.ranks[p]}, GPU {','.join(map(str, view.gpu_of.get(p, {})))})"
                               for p in holding))
    inc.evidence = {"holders": {str(p): {"rank": job.ranks[p], "gpu_mem_bytes": held(p), "reason": reason(view, p)}
                                for p in holding}}
    env.book.touch(inc, t)


def unattributed(env: Env, since: dict[int, float], t: float) -> None:
    """GPU memory that no visible process holds, for a while."""
    th = env.th
    for idx, dq in env.view.gpus.items():
        if not dq:
            continue
        _, g = dq[-1]
        if g.mem_used is None:
            continue
        held = sum(p.used or 0 for p in g.procs)
        base = min(env.view.gpu_baseline.get(idx, g.mem_used), th.unattributed_base_bytes)
        extra = g.mem_used - held - base
        key = f"gpu:{idx}"
        inc = env.book.get(key, FAMILY)
        if extra >= th.unattributed_gpu_bytes:
            first = since.setdefault(idx, t)
            if t - first >= th.unattributed_gpu_s and inc is None:
                inc = env.book.open_incident(IncidentKind.ORPHANED_GPU_MEMORY, key, t)
                inc.summary = (f"GPU {idx} has {extra / GiB:.1f} GiB in use that no visible process holds "
                               f"(used {g.mem_used / GiB:.1f} GiB, processes {held / GiB:.1f} GiB): a process in "
                               "another PID namespace, or leaked memory. Check `nvidia-smi` on the host.")
                inc.evidence = {"gpu": idx, "mem_used": g.mem_used, "held_by_processes": held}
        else:
            since.pop(idx, None)
            if inc is not None:
                env.book.resolve(inc, t, "the memory was freed")
