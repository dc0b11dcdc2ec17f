"""What the facts of setting up need from earlier ticks, kept in one stage that runs before them.

Each tick, for every rank still setting up (``ProcTrack.started`` false): since when it has been
asleep, since when it has worked (on the CPU, reading or writing), since when it has held about
the GPU memory it holds, what it held when its process group came up, and whether that grew
since. ``gather.first_evidence`` and ``gather.own_cpu_before_nccl`` only read these marks; nothing
else writes them. A rank set up keeps them as they were: nothing reads them any more.
"""

from __future__ import annotations

from hangd.analysis.detectors import Env
from hangd.analysis.model import Local
from hangd.analysis.views import JobView

# Readings of a rank at work while it sets up: on the CPU, reading, writing or blocked in I/O
WORKING = (Local.LOADING, Local.WRITING, Local.IO_WAIT, Local.CPU, Local.BUSY)


def remember(env: Env, jv: JobView) -> None:
    """Update the setting-up marks of the job's live ranks not yet set up, from this tick."""
    for pid in jv.live:
        if jv.readings[pid].local != Local.ZOMBIE and not env.track(pid).started:
            _setup_marks(env, pid, jv)


def _setup_marks(env: Env, pid: int, jv: JobView) -> None:
    th, t = env.th, jv.t
    p, s, loc = env.track(pid), jv.sigs[pid], jv.readings[pid].local
    asleep = (s.cpu_cores or 0) < th.startup_quiet_cpu_cores and s.state in ("S", "I") and loc == Local.QUIET
    p.quiet_since = (p.quiet_since if p.quiet_since is not None else t) if asleep else None
    p.working_since = (p.working_since if p.working_since is not None else t) if loc in WORKING else None
    if not s.gpu_indexes:
        return
    grew = th.startup_gpu_mem_grew_bytes
    if p.gpu_mem_mark is None or abs(s.gpu_mem - p.gpu_mem_mark[1]) > grew:
        p.gpu_mem_mark = (t, s.gpu_mem)
    if group_up(env, pid):
        p.pg_up_mem = s.gpu_mem if p.pg_up_mem is None else p.pg_up_mem
        p.pg_mem_grew = p.pg_mem_grew or s.gpu_mem > p.pg_up_mem + grew


def group_up(env: Env, pid: int) -> bool:
    """torch.distributed's threads run in it (gloo's or NCCL's): its imports and init are over."""
    lp = env.view.procs[pid].latest()
    return lp is not None and bool(lp.dist_threads)
