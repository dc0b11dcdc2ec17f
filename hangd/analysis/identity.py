"""Which processes form which job, and each one's rank, with how each was known.

A job is one launch. Its key is made of what is unique to a launch and shared by its ranks: a
Slurm job step, a TorchElastic run id that is not the default (``none``), the rendezvous address
``MASTER_ADDR:MASTER_PORT`` and restart count; where those are not unique to one launch (plain
``torchrun`` without ``--rdzv-id`` gives every job the run id ``none``, and every job on a node may
use port 29500), the launcher process is part of the key. Processes started without any of these
(an inference server's ``multiprocessing`` workers, which get their rank as an argument) are one
job when they are siblings of one launcher. Two processes with the same rank are never one job.

A job whose ranks run on several nodes (its world size is larger than this launch's ranks:
torchrun ``--nnodes`` sets ``LOCAL_WORLD_SIZE`` below ``WORLD_SIZE`` and ``GROUP_WORLD_SIZE`` above
one; Slurm sets ``SLURM_NNODES``) must get the same key on every node, so its key is made only of
what every node's ranks share: the scheduler's ids (``SLURM_JOB_ID``, a Kubernetes JobSet name in
``JOBSET_NAME``), a run id that is not the default, the rendezvous ``MASTER_ADDR:MASTER_PORT`` (with
c10d rendezvous, the address and port that node rank 0 published in the rendezvous store) and the
restart count; never the launcher, which is another process on every node.

A rank process is one that holds its own GPU memory, has a rank of its own in its environment, or
runs torch.distributed's gloo/NCCL threads, and is not a child that inherited a rank's environment
(data-loader and compile workers). What the ancestors hold does not matter: a notebook or server
front-end that touched CUDA does not hide the ranks below it.

Ranks come from, in order: the environment (``RANK``, ``PMI_RANK``, ...), flight-recorder dumps,
torch's ``[rankN]`` log prefix, the process title or command line (``TP3``, ``--rank 3``),
``LOCAL_RANK``, the GPU index, and start order. ``Job.rank_source`` says which, per pid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hangd.analysis import owner
from hangd.analysis.nodeview import NodeView, ProcHistory
from hangd.analysis.thresholds import Thresholds
from hangd.snapshot import Role

RANK_KEYS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
DEFAULT_RUN_IDS = frozenset({"", "none", "default"})
_LOG_RANK = re.compile(r"^\[rank(\d+)\]", re.M)
# how servers name a worker's rank in its title or arguments: "sglang::scheduler_TP3", "TP3",
# "--rank 3", "--tp-rank=3", "rank=3", "VllmWorker TP3 rank=3"
_ARG_RANK = re.compile(r"(?:^|[\s_:-])(?:tp|TP)[-_]?(\d+)\b|(?:^|\s)--?(?:tp[-_])?rank[= ](\d+)\b|\brank=(\d+)\b")


@dataclass
class Job:
    id: str
    name: str
    ranks: dict[int, int] = field(default_factory=dict)  # pid -> rank
    rank_source: dict[int, str] = field(default_factory=dict)  # pid -> how its rank was known
    key_parts: dict[str, str] = field(default_factory=dict)  # what the key was made of
    launcher: int | None = None
    world_size: int | None = None
    distributed: bool = False  # several ranks, or a world size above 1: a peer exists to wait for
    spans_nodes: str | None = None  # why its ranks are only part of the job (the others run on other nodes)
    who: dict[str, Any] = field(default_factory=dict)  # its owner, Slurm job and pod (hangd.analysis.owner)

    @property
    def pids(self) -> list[int]:
        return sorted(self.ranks, key=lambda p: (self.ranks[p], p))

    def rank_pid(self) -> dict[int, int]:
        return {r: p for p, r in self.ranks.items()}


def env_of(h: ProcHistory) -> dict[str, str]:
    return (h.info.environ or {}) if h.info else {}


def env_rank(h: ProcHistory) -> str | None:
    return h.memo_of_info("env_rank", _env_rank)


def _env_rank(h: ProcHistory) -> str | None:
    env = env_of(h)
    return next((env[k] for k in RANK_KEYS if env.get(k) is not None), None)


def ancestors(view: NodeView, h: ProcHistory, depth: int | None = None) -> list[ProcHistory]:
    """Up to ``depth`` (default: Thresholds.ancestor_depth) watched ancestors, nearest first."""
    out = []
    cur = h.first_ppid if h.first_ppid is not None else (lp.ppid if (lp := h.latest()) else None)
    for _ in range(view.th.ancestor_depth if depth is None else depth):
        a = view.procs.get(cur) if cur else None
        if a is None or a.pid == h.pid:
            break
        out.append(a)
        cur = a.first_ppid if a.first_ppid is not None else (alp.ppid if (alp := a.latest()) else None)
    return out


def has_dist_threads(h: ProcHistory) -> bool:
    """It runs torch.distributed's gloo or NCCL threads (seen by the /proc source)."""
    lp = h.latest()
    return bool(lp is not None and lp.dist_threads)


def _launcher_env(h: ProcHistory) -> bool:
    """Its environment names a launcher (torchrun, Slurm, MPI): a rank number in it is a job's."""
    env = env_of(h)
    return any(k in env for k in ("MASTER_ADDR", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"))


class _Ranker:
    """Decides, with memory across one tick, which processes are ranks."""

    def __init__(self, view: NodeView, th: Thresholds) -> None:
        self.view = view
        self.th = th
        self.memo: dict[int, bool] = {}

    def candidate(self, h: ProcHistory) -> bool:
        if h.pid in self.memo:
            return self.memo[h.pid]
        self.memo[h.pid] = False  # cycles (pid reuse) end here
        self.memo[h.pid] = ok = self._candidate(h)
        return ok

    def _candidate(self, h: ProcHistory) -> bool:
        view = self.view
        anc = ancestors(view, h)
        r = env_rank(h)
        if r is not None and any(env_rank(a) == r for a in anc):
            return False  # a rank's child: it inherited the environment (data loader, compile worker)
        if r is not None and _launcher_env(h):
            return True
        rank_anc = next((a for a in anc if self.candidate(a)), None)
        gpu = h.pid in view.gpu_of
        dist = has_dist_threads(h)
        if rank_anc is not None:
            if dist:
                return True  # its own gloo/NCCL threads: a rank spawned by a rank (vLLM's driver worker)
            lp = h.latest()
            own = _arg_rank(h)
            if lp is not None and lp.role == Role.WORKER and own is not None and own != _arg_rank(rank_anc):
                return True  # a rank of its own as an argument, started by rank 0 (before its threads run)
            if gpu and r is None:
                # a child that touched CUDA only counts with a GPU of its own and more than a context on it
                mine = set(view.gpu_of.get(h.pid, {}))
                theirs = set(view.gpu_of.get(rank_anc.pid, {}))
                held = sum(v or 0 for v in view.gpu_of.get(h.pid, {}).values())
                return not (mine & theirs) and held >= self.th.started_gpu_mem_bytes
            return False
        if gpu or dist:
            return True
        lp = h.latest()
        return lp is not None and lp.role == Role.WORKER

    def launcher_of_ranks(self, h: ProcHistory, candidates: set[int]) -> bool:
        """A process without a rank of its own whose descendants are ranks with theirs: the launcher
        (torchrun, a notebook, a server front-end), whatever it holds."""
        if env_rank(h) is not None or has_dist_threads(h):
            return False
        return any(h.pid in {a.pid for a in ancestors(self.view, self.view.procs[c])} and env_rank(self.view.procs[c])
                   is not None for c in candidates if c != h.pid)


def rank_processes(view: NodeView, th: Thresholds) -> list[ProcHistory]:
    rk = _Ranker(view, th)
    cands = {h.pid for h in view.procs.values() if rk.candidate(h)}
    return [view.procs[p] for p in sorted(cands) if not rk.launcher_of_ranks(view.procs[p], cands)]


def learn_log_ranks(view: NodeView) -> None:
    """torch prefixes its log lines with ``[rankN]``: a rank hint when the env has none (only from
    a log that one process writes)."""
    writers: dict[str, int] = {}
    for h in view.procs.values():
        for target in log_targets(h):
            writers[target] = writers.get(target, 0) + 1
    for h in view.procs.values():
        if h.pid in view.log_ranks or h.info is None:
            continue
        for target in log_targets(h):
            fs = view.files.get(target)
            if fs is not None and fs.tail and writers.get(target) == 1:
                found = set(_LOG_RANK.findall(fs.tail))
                if len(found) == 1:
                    view.log_ranks[h.pid] = int(found.pop())


def log_targets(h: ProcHistory) -> frozenset[str]:
    """The files a process writes its stdout/stderr to (one home for this, used everywhere)."""
    return h.logs()


def _arg_rank(h: ProcHistory) -> int | None:
    texts = []
    lp = h.latest()
    if lp is not None and lp.comm:
        texts.append(lp.comm)
    if h.info and h.info.cmdline:
        texts.append(" ".join(h.info.cmdline))
    for text in texts:
        m = _ARG_RANK.search(text)
        if m:
            return int(next(g for g in m.groups() if g is not None))
    return None


def _rank_of(h: ProcHistory, fr_ranks: dict[int, int], log_ranks: dict[int, int]) -> tuple[int, str] | None:
    env = env_of(h)
    for k in RANK_KEYS:
        v = env.get(k)
        if v is not None and v.isdigit():
            return int(v), f"environment {k}"
    if h.pid in fr_ranks:
        return fr_ranks[h.pid], "flight-recorder dump"
    if h.pid in log_ranks:
        return log_ranks[h.pid], "[rankN] prefix in its log"
    r = _arg_rank(h)
    if r is not None:
        return r, "process title or command line"
    v = env.get("LOCAL_RANK")
    if v is not None and v.isdigit():
        return int(v), "environment LOCAL_RANK"
    return None


def _int(env: dict[str, str], k: str) -> int | None:
    v = env.get(k, "").strip()
    return int(v) if v.isdigit() else None


def spans_nodes(env: dict[str, str]) -> str | None:
    """Why a rank's job has ranks on other nodes too (from its own environment), or None."""
    world, local = _int(env, "WORLD_SIZE"), _int(env, "LOCAL_WORLD_SIZE")
    if world is not None and local is not None and world > local:
        return f"WORLD_SIZE {world} > LOCAL_WORLD_SIZE {local}"
    groups = _int(env, "GROUP_WORLD_SIZE")
    if groups is not None and groups > 1:
        return f"GROUP_WORLD_SIZE {groups}"
    nodes = _int(env, "SLURM_NNODES") or _int(env, "SLURM_JOB_NUM_NODES")
    if nodes is not None and nodes > 1:
        return f"SLURM_NNODES {nodes}"
    world, local = _int(env, "OMPI_COMM_WORLD_SIZE"), _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
    if world is not None and local is not None and world > local:
        return f"OMPI_COMM_WORLD_SIZE {world} > OMPI_COMM_WORLD_LOCAL_SIZE {local}"
    return None


def _key(view: NodeView, h: ProcHistory) -> tuple[str, dict[str, str]]:
    """The launch a rank belongs to, and what the key was made of."""
    env = env_of(h)
    parts: dict[str, str] = {}
    launcher = h.first_ppid if h.first_ppid and h.first_ppid > 1 else None
    multi = spans_nodes(env)
    if env.get("SLURM_JOB_ID"):
        parts["slurm_job"] = env["SLURM_JOB_ID"] + (f".{env['SLURM_STEP_ID']}" if env.get("SLURM_STEP_ID") else "")
    if multi and env.get("JOBSET_NAME"):
        parts["jobset"] = env["JOBSET_NAME"]
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id is not None and run_id.strip().lower() not in DEFAULT_RUN_IDS:
        parts["run_id"] = run_id
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        parts["rendezvous"] = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    restart = env.get("TORCHELASTIC_RESTART_COUNT")
    if restart and restart != "0":
        parts["restart"] = restart
    if parts:
        unique = "slurm_job" in parts or "run_id" in parts
        if not unique and launcher is not None and not multi:
            # plain torchrun: run id "none", the same port every time; one launch = one launcher
            parts["launcher"] = str(launcher)
        # short and readable (it is a metrics label too): the most specific part, then the restart
        # and the launcher where they are part of the key; the parts themselves are in /jobs
        if "slurm_job" in parts:
            key = f"slurm:{parts['slurm_job']}"
        elif "jobset" in parts:
            key = f"jobset:{parts['jobset']}"
        elif "run_id" in parts:
            key = f"te:{parts['run_id']}"
        else:
            key = f"rdzv:{parts['rendezvous']}"
        key += (f"/r{parts['restart']}" if "restart" in parts else "") + \
            (f"@{parts['launcher']}" if "launcher" in parts else "")
        name = parts.get("run_id") or parts.get("slurm_job") or parts.get("jobset") or parts.get("rendezvous") or key
        return key, {**parts, "name": name}
    if launcher is not None and launcher in view.procs:
        return f"launcher:{launcher}", {"launcher": str(launcher), "name": f"launcher {launcher}"}
    return f"pid:{h.pid}", {"pid": str(h.pid), "name": f"pid {h.pid}"}


def grouping_inputs(view: NodeView, th: Thresholds, fr_ranks: dict[int, int]) -> tuple[object, ...]:
    """Everything ``group_jobs`` reads, as one value: per process its static facts (``info``, by
    identity), parent, role, torch.distributed threads and name; which GPUs it holds and whether
    that is more than a context; the ranks logs and flight-recorder dumps named. Equal at two
    ticks, the grouping is the same."""
    procs = []
    for h in view.procs.values():
        lp = h.latest()
        procs.append((h.pid, h.info, h.first_ppid) if lp is None else
                     (h.pid, h.info, h.first_ppid, lp.ppid, lp.role, bool(lp.dist_threads), lp.comm, lp.start_time))
    gpus = tuple((pid, tuple(d), sum(v or 0 for v in d.values()) >= th.started_gpu_mem_bytes)
                 for pid, d in view.gpu_of.items())
    return (th, tuple(procs), gpus, tuple(view.log_ranks.items()), tuple(fr_ranks.items()))


def group_jobs(view: NodeView, th: Thresholds | None = None, fr_ranks: dict[int, int] | None = None) -> dict[str, Job]:
    """The jobs on the node, their ranks and launchers. Worked out again only when what it reads
    changed (``grouping_inputs``): on most ticks no process came, went or changed its role."""
    th = th or Thresholds()
    fr_ranks = fr_ranks or {}
    learn_log_ranks(view)
    key = grouping_inputs(view, th, fr_ranks)
    memo = view.jobs_memo
    if memo is not None and memo[0] == key:
        return dict(memo[1])
    jobs = _group_jobs(view, th, fr_ranks)
    view.jobs_memo = (key, jobs)
    return dict(jobs)


def _group_jobs(view: NodeView, th: Thresholds, fr_ranks: dict[int, int]) -> dict[str, Job]:
    members: dict[str, list[ProcHistory]] = {}
    parts_of: dict[str, dict[str, str]] = {}
    ranks = rank_processes(view, th)
    keyed = {h.pid: _key(view, h) for h in ranks}
    for h in ranks:
        key, parts = keyed[h.pid]
        if key.startswith("launcher:") and h.first_ppid in keyed:
            # spawned by a rank (vLLM runs rank 0 in the engine process, ranks 1.. in its children)
            key, parts = keyed[h.first_ppid]
        members.setdefault(key, []).append(h)
        parts_of[key] = parts
    # two processes with the same rank are never one job: split them by launcher
    for key in list(members):
        hs = members[key]
        seen: dict[str, list[ProcHistory]] = {}
        for h in hs:
            r = env_rank(h)
            if r is not None:
                seen.setdefault(r, []).append(h)
        if any(len(v) > 1 for v in seen.values()):
            del members[key]
            for h in hs:
                k2 = f"{key}@{h.first_ppid or h.pid}"
                members.setdefault(k2, []).append(h)
                parts_of[k2] = {**parts_of[key], "launcher": str(h.first_ppid or h.pid)}
    jobs: dict[str, Job] = {}
    for key, hs in members.items():
        parts = dict(parts_of[key])
        name = parts.pop("name", key)
        job = jobs[key] = Job(id=key, name=name, key_parts=parts)
        for h in hs:
            ws = env_of(h).get("WORLD_SIZE")
            if ws and ws.isdigit():
                job.world_size = int(ws)
            job.spans_nodes = job.spans_nodes or (spans_nodes(env_of(h)) if "launcher" not in parts else None)
        _assign_ranks(view, job, hs, fr_ranks)
        job.who = owner.who(sorted(hs, key=lambda h: (job.ranks[h.pid], h.pid)))
        parents = {h.first_ppid for h in hs}
        if len(parents) == 1:
            p = parents.pop()
            if p and p > 1 and p in view.procs:
                job.launcher = p
                lh = view.procs[p]
                if lh.info and lh.info.cmdline and key.startswith("launcher:"):
                    job.name = " ".join(lh.info.cmdline[:3])[:80]
        job.distributed = len(hs) > 1 or (job.world_size or 1) > 1
    return jobs


def _assign_ranks(view: NodeView, job: Job, hs: list[ProcHistory], fr_ranks: dict[int, int]) -> None:
    taken: set[int] = set()
    unranked = []
    for h in sorted(hs, key=lambda x: x.pid):
        found = _rank_of(h, fr_ranks, view.log_ranks)
        if found is None or found[0] in taken:
            unranked.append(h)
            continue
        job.ranks[h.pid], job.rank_source[h.pid] = found
        taken.add(found[0])
    # then by GPU index, then by start order
    def order(x: ProcHistory) -> tuple[int, float, int]:
        gpus = view.gpu_of.get(x.pid) or {}
        lp = x.latest()
        return (min(gpus) if gpus else 1 << 20, (lp.start_time if lp and lp.start_time else x.first_seen), x.pid)

    for h in sorted(unranked, key=order):
        r = 0
        while r in taken:
            r += 1
        job.ranks[h.pid] = r
        job.rank_source[h.pid] = "GPU index order" if view.gpu_of.get(h.pid) else "start order"
        taken.add(r)
