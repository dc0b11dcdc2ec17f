"""Evidence a person reads: stack briefs, log tails, exceptions found in logs, lost threads.
Everything here reads the node view and the tracks; nothing decides or mutates."""

from __future__ import annotations

import os
import time
from typing import Any

from hangd.analysis import stackcat
from hangd.analysis.identity import Job, log_targets
from hangd.analysis.nodeview import NodeView
from hangd.analysis.signals import ProcSignals
from hangd.analysis.views import ProcTrack
from hangd.redact import redact_text

FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def stack_brief(view: NodeView, track: ProcTrack | None, pid: int) -> dict[str, Any] | None:
    h = view.procs.get(pid)
    if h is None or not h.stacks:
        return None
    t, samples = h.stacks[-1]
    # the newest Python-level capture and the newest native one (they may come at different ticks)
    py = next((s for _, ss in reversed(h.stacks) for s in ss if not s.native and s.threads), None)
    native = next((s for _, ss in reversed(h.stacks) for s in ss if s.native and s.threads), None)
    py = py or native
    v = track.verdict if track is not None else stackcat.UNKNOWN
    out: dict[str, Any] = {"pid": pid, "t": round(t, 3), "verdict": v.kind, "why": v.why, "frame": v.frame,
                           "frames": stackcat.summarize(py, 12) if py else [], "threads": len(py.threads) if py else 0,
                           "captures": len(h.stacks)}
    if native is not None:
        out["native_frames"] = stackcat.summarize(native, 24)
    errors = [s.error for s in samples if s.error]
    sigs = {stackcat.signature(s) for _, ss in h.stacks for s in ss if not s.native and s.threads}
    py_caps = sum(1 for _, ss in h.stacks for s in ss if not s.native and s.threads)
    if py_caps >= 2:
        out["unchanged_across_captures"] = len(sigs) == 1
    gone = threads_gone(h.stacks)
    if gone:
        out["threads_gone"] = gone
    if errors:
        out["errors"] = errors
    return out


def thread_key(th: Any) -> str:
    return f"{th.name or 'thread'} (tid {th.tid})" if th.tid is not None else str(th.name)


def threads_gone(stacks: list[tuple[float, list[Any]]]) -> list[str]:
    """Threads seen in an earlier capture and missing from the newest Python one."""
    caps = [(t, s) for t, ss in stacks for s in ss if not s.native and s.threads]
    if len(caps) < 2:
        return []
    last_t, last = caps[-1]
    now = {thread_key(th) for th in last.threads}
    out: list[str] = []
    for t, s in caps[:-1]:
        for th in s.threads:
            k = thread_key(th)
            if k not in now and not any(k in x for x in out):
                out.append(f"thread {k} seen at {clock(t)} is gone at {clock(last_t)}")
    return out


def log_tails(view: NodeView, h_pid: int, lines: int | None = None) -> list[str] | None:
    h = view.procs.get(h_pid)
    if h is None:
        return None
    for target in log_targets(h):
        fs = view.files.get(target)
        if fs is not None and fs.tail:
            return [redact_text(x) for x in fs.tail.splitlines()[-(view.th.log_lines_quoted if lines is None else lines):]]
    return None


def exception_as_it_stopped(view: NodeView, job: Job, last_progress: float, window_s: float) -> bool:
    """An exception line in a log of the job, logged no earlier than a window before its last progress
    (one already in the log when hangd first read it is of an unknown time: not this)."""
    return any(x["t"] is not None for x in exceptions(view, job, last_progress - window_s))


def exceptions(view: NodeView, job: Job, since: float) -> list[dict[str, Any]]:
    """Exception lines in the job's logs (its ranks' and its launcher's) that appeared after
    ``since``, or were already there when hangd first read the log; newest last."""
    pids = list(job.pids) + ([job.launcher] if job.launcher else [])
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for pid in pids:
        h = view.procs.get(pid)
        if h is None:
            continue
        for target in sorted(log_targets(h)):
            if target in seen:
                continue
            seen.add(target)
            fs = view.files.get(target)
            if fs is None:
                continue
            writers = [p for p in job.pids if (hp := view.procs.get(p)) is not None and target in log_targets(hp)]
            for at, line in fs.exceptions:
                if at is not None and at < since:
                    continue
                rank = job.ranks.get(writers[0]) if len(writers) == 1 else None
                if rank is None and line.startswith("[rank"):
                    rank = int(line[5:line.index("]")]) if "]" in line and line[5:line.index("]")].isdigit() else None
                out.append({"t": at, "log": target, "file": os.path.basename(target), "rank": rank,
                            "line": redact_text(line)})
    out.sort(key=lambda x: x["t"] or 0.0)
    return out


def quote_exception(ex: dict[str, Any]) -> str:
    when = f"at {clock(ex['t'])}" if ex["t"] is not None else "(already in the log when hangd first read it)"
    who = f"rank {ex['rank']}'s log" if ex["rank"] is not None else "the job's log"
    return f"{who} ({ex['file']}) {when}: {ex['line']}"


def flight_recording_off(view: NodeView, job: Job) -> bool:
    """None of the job's ranks has a flight-recorder buffer set (so no dump can tell the collective)."""
    for pid in job.pids:
        h = view.procs.get(pid)
        env = (h.info.environ or {}) if h is not None and h.info is not None else None
        if env is None:
            return False  # unknown: say nothing
        if any((env.get(k) or "0").strip() not in ("", "0") for k in FR_ENV):
            return False
    return bool(job.pids)


FR_HINT = ("Flight recording is off for this job: start it with TORCH_FR_BUFFER_SIZE=2000 (before torch 2.7: "
           "TORCH_NCCL_TRACE_BUFFER_SIZE=2000), TORCH_FR_DUMP_TEMP_FILE=<dir>/nccl_trace_rank_ and "
           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<dir>/fr_pipe_ so that hangd can ask each rank for a dump without stopping it.")


def evidence(view: NodeView, tracks: dict[int, ProcTrack], job: Job, sigs: dict[int, ProcSignals],
             quiet: float) -> dict[str, Any]:
    ev: dict[str, Any] = {"quiet_for_s": round(quiet, 1), "stacks": {}, "processes": {}, "logs": {}, "environ": {},
                          "gpus": {}, "ranks_from": {str(job.ranks[p]): job.rank_source.get(p, "") for p in job.pids},
                          "job_identity": job.key_parts}
    for pid in job.pids:
        r = str(job.ranks[pid])
        tr = tracks.get(pid)
        st = stack_brief(view, tr, pid)
        if st:
            ev["stacks"][r] = st
        if pid in sigs and tr is not None:
            ev["processes"][r] = {"pid": pid, "local": str(tr.reading.local), "why": tr.reading.why, **sigs[pid].brief()}
            s = sigs[pid]
            if s.threads_lost_at is not None:
                ev["processes"][r]["threads_lost"] = {"t": round(s.threads_lost_at, 3), "before": s.threads_before,
                                                      "after": s.threads_after}
        h = view.procs.get(pid)
        if h is not None and h.info is not None:
            ev["environ"][r] = dict(h.info.environ or {})
        tail = log_tails(view, pid)
        if tail:
            ev["logs"][r] = tail
        for idx in (sigs[pid].gpu_indexes if pid in sigs else []):
            dq = view.gpus.get(idx)
            if dq:
                g = dq[-1][1]
                ev["gpus"][str(idx)] = {"util_gpu": g.util_gpu, "util_mem": g.util_mem,
                                        "power_w": g.power_w, "mem_used": g.mem_used, "gpm": g.gpm}
    return ev
