"""Group processes into distributed jobs and map pid <-> rank.

A job is recognised by, in order: ``TORCHELASTIC_RUN_ID``, a Slurm job (+step), the rendezvous
``MASTER_ADDR:MASTER_PORT``, the common launcher ancestor, and otherwise the process alone.
Ranks come from ``RANK`` (then ``PMI_RANK``/``OMPI_COMM_WORLD_RANK``/``SLURM_PROCID``), then
flight-recorder dumps, then ``LOCAL_RANK``, then GPU index order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hangd.analysis.signals import NodeView, ProcHistory

RANK_KEYS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


@dataclass
class Job:
    id: str
    name: str
    ranks: dict[int, int] = field(default_factory=dict)  # pid -> rank
    launcher: int | None = None
    world_size: int | None = None

    @property
    def pids(self) -> list[int]:
        return sorted(self.ranks, key=lambda p: (self.ranks[p], p))


def _env(h: ProcHistory) -> dict[str, str]:
    return (h.info.environ or {}) if h.info else {}


def _ancestors(view: NodeView, h: ProcHistory, depth: int = 4) -> list[ProcHistory]:
    out = []
    lp = h.latest()
    cur = lp.ppid if lp is not None else h.first_ppid
    for _ in range(depth):
        a = view.procs.get(cur) if cur else None
        if a is None:
            break
        out.append(a)
        alp = a.latest()
        cur = alp.ppid if alp is not None else a.first_ppid
    return out


def is_rank_process(view: NodeView, h: ProcHistory) -> bool:
    """A process hangd reports a state for: it holds a GPU, or it carries a rank in its env.
    A descendant of a rank (compile workers, data loaders inherit its env) is not one."""
    anc = _ancestors(view, h)
    if any(a.pid in view.gpu_of for a in anc):
        return False
    rank = next((_env(h).get(k) for k in RANK_KEYS if _env(h).get(k) is not None), None)
    if rank is not None and any(next((_env(a).get(k) for k in RANK_KEYS if _env(a).get(k) is not None), None) == rank
                                for a in anc):
        return False
    if h.pid in view.gpu_of:
        return True
    lp = h.latest()
    if lp is not None and lp.role is not None:
        return lp.role == "worker"
    env = _env(h)
    if any(k in env for k in RANK_KEYS) and ("MASTER_ADDR" in env or "TORCHELASTIC_RUN_ID" in env):
        lp = h.latest()
        return not (lp is not None and lp.role == "launcher")
    return False


_LOG_RANK = re.compile(r"^\[rank(\d+)\]", re.M)


def learn_log_ranks(view: NodeView) -> None:
    """torch prefixes its log lines with ``[rankN]``: a rank hint when the env has none."""
    for h in view.procs.values():
        if h.pid in view.log_ranks or h.info is None:
            continue
        for target in {v for v in (h.info.fds or {}).values() if v}:
            fs = view.files.get(target)
            if fs is not None and fs.tail:
                found = set(_LOG_RANK.findall(fs.tail))
                if len(found) == 1:
                    view.log_ranks[h.pid] = int(found.pop())


def _rank_of(h: ProcHistory, fr_ranks: dict[int, int], log_ranks: dict[int, int]) -> int | None:
    env = _env(h)
    for k in RANK_KEYS:
        v = env.get(k)
        if v is not None and v.isdigit():
            return int(v)
    if h.pid in fr_ranks:
        return fr_ranks[h.pid]
    if h.pid in log_ranks:
        return log_ranks[h.pid]
    v = env.get("LOCAL_RANK")
    return int(v) if v is not None and v.isdigit() else None


def _job_key(view: NodeView, h: ProcHistory) -> tuple[str, str]:
    env = _env(h)
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torchelastic:{env['TORCHELASTIC_RUN_ID']}", env["TORCHELASTIC_RUN_ID"]
    if env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID")
        key = f"slurm:{env['SLURM_JOB_ID']}" + (f".{step}" if step else "")
        return key, key
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        key = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        return f"rdzv:{key}", key
    ppid = h.first_ppid
    if ppid and ppid > 1 and ppid in view.procs:
        return f"launcher:{ppid}", f"launcher {ppid}"
    return f"pid:{h.pid}", f"pid {h.pid}"


def group_jobs(view: NodeView, fr_ranks: dict[int, int] | None = None) -> dict[str, Job]:
    fr_ranks = fr_ranks or {}
    learn_log_ranks(view)
    jobs: dict[str, Job] = {}
    members: dict[str, list[ProcHistory]] = {}
    for h in view.procs.values():
        if not is_rank_process(view, h):
            continue
        key, name = _job_key(view, h)
        members.setdefault(key, []).append(h)
        job = jobs.get(key)
        if job is None:
            job = jobs[key] = Job(id=key, name=name)
        ws = _env(h).get("WORLD_SIZE")
        if ws and ws.isdigit():
            job.world_size = int(ws)
    for key, hs in members.items():
        job = jobs[key]
        taken: set[int] = set()
        unranked = []
        for h in sorted(hs, key=lambda x: x.pid):
            r = _rank_of(h, fr_ranks, view.log_ranks)
            if r is None or r in taken:
                unranked.append(h)
                continue
            job.ranks[h.pid] = r
            taken.add(r)
        # then by GPU index, then by pid
        for h in sorted(unranked, key=lambda x: (min(view.gpu_of.get(x.pid, {0: 0}) or [0]), x.pid)):
            r = 0
            while r in taken:
                r += 1
            job.ranks[h.pid] = r
            taken.add(r)
        parents = {h.first_ppid for h in hs}
        if len(parents) == 1:
            p = parents.pop()
            if p and p > 1 and p in view.procs:
                job.launcher = p
                lh = view.procs[p]
                if lh.info and lh.info.cmdline and key.startswith("launcher:"):
                    job.name = " ".join(lh.info.cmdline[:3])[:80]
    return jobs
