"""Score a replay against a trace's ground truth: per-second state accuracy and incidents.

The rule: each pid in the truth is compared each whole second from the trace start to its end
(the ``sigkill_all`` teardown excluded). A prediction counts as right if it equals the truth at
that second or the truth up to ``lag_s`` earlier (``hung_lag_s`` when the truth is ``hung``):
a change may lag the truth.
"""

from __future__ import annotations

import math
from typing import Any

from hangd.trace import TraceReader


def _state_at(lines: list[tuple[float, str]], t: float) -> str | None:
    cur = None
    for tt, st in lines:
        if tt <= t + 1e-9:
            cur = st
        else:
            break
    return cur


def score(trace_dir: str, states: list[dict[str, Any]], lag_s: float = 6.0, hung_lag_s: float = 20.0) -> dict[str, Any]:
    reader = TraceReader(trace_dir)
    truth = reader.truth()
    meta = reader.meta
    t0 = float(meta.get("t_start") or min(x["t"] for x in truth))
    t_end = float(meta.get("t_end") or max(x["t"] for x in truth))
    for ev in reader.events():
        if ev["kind"] == "action" and ev.get("what") == "sigkill_all":
            t_end = min(t_end, float(ev["t"]))
    by_pid_truth: dict[int, list[tuple[float, str]]] = {}
    for x in sorted(truth, key=lambda x: x["t"]):
        by_pid_truth.setdefault(int(x["pid"]), []).append((float(x["t"]), x["state"]))
    by_pid_pred: dict[int, list[tuple[float, str]]] = {}
    for x in sorted(states, key=lambda x: x["t"]):
        by_pid_pred.setdefault(int(x["pid"]), []).append((float(x["t"]), x["state"]))
    total = right = 0
    per_pid: dict[int, dict[str, Any]] = {}
    for pid, tl in by_pid_truth.items():
        ok = n = 0
        wrong: list[tuple[int, str | None, str | None]] = []
        first = tl[0][0]
        for sec in range(math.ceil(max(t0, first)), math.floor(t_end) + 1):
            t = float(sec)
            want = _state_at(tl, t)
            if want is None or want == "gone":
                continue
            got = _state_at(by_pid_pred.get(pid, []), t)
            allowed = {want}
            for tt, st in tl:
                lag = hung_lag_s if st == "hung" else lag_s
                if tt <= t < tt + lag:
                    prev = _state_at(tl, tt - 1e-6)
                    if prev is not None:
                        allowed.add(prev)
            n += 1
            if got in allowed:
                ok += 1
            else:
                wrong.append((sec - math.ceil(t0), want, got))
        per_pid[pid] = {"seconds": n, "right": ok, "accuracy": ok / n if n else 1.0, "wrong": wrong[:20]}
        total += n
        right += ok
    return {"accuracy": right / total if total else 1.0, "seconds": total, "per_pid": per_pid,
            "hang_start": next((tt for tl in by_pid_truth.values() for tt, st in tl if st == "hung"), None)}
