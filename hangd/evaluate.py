"""Score a replay against a trace's ground truth: per-second state accuracy and incidents.

The rule: each pid in the truth is compared each whole second from the trace start to its end
(the ``sigkill_all`` teardown excluded). A prediction counts as right if it equals the truth at
that second or the truth up to ``lag_s`` earlier (``hung_lag_s`` when the truth is ``hung``):
a change may lag the truth.
"""

from __future__ import annotations

import json
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
        confusion: dict[str, int] = {}
        for _, want, got in wrong:
            confusion[f"{want}->{got}"] = confusion.get(f"{want}->{got}", 0) + 1
        per_pid[pid] = {"seconds": n, "right": ok, "accuracy": ok / n if n else 1.0, "wrong": wrong[:20],
                        "confusion": confusion}
        total += n
        right += ok
    return {"accuracy": right / total if total else 1.0, "seconds": total, "per_pid": per_pid,
            "hang_start": next((tt for tl in by_pid_truth.values() for tt, st in tl if st == "hung"), None)}


def is_check_cell(name: str) -> bool:
    """Whether a matrix cell is in the check set: a quarter of the cells, picked by a seeded hash of the
    cell's name, never tuned on (scripts/matrix.py and its test both ask this)."""
    import hashlib

    return int(hashlib.sha256(f"hangd-matrix:{name}".encode()).hexdigest(), 16) % 4 == 0


def expect_problems(expect: dict[str, Any], incidents: list[dict[str, Any]],
                    hang_kinds: tuple[str, ...]) -> list[str]:
    """What a replay's incidents miss of a trace's ``expect.json`` (empty when it meets it): no hang
    incident where there is no hang, one where there is (of ``hang_kinds`` or the kind expected), the
    expected kind with the culprit rank, the quoted cause, the flight-recorder seq and the pid the
    summary must name; none of the kinds that must not open; one hang incident only where the
    recording has one hang (``one_incident_per_hang``)."""
    kinds = [i["kind"] for i in incidents]
    out = []
    want = expect.get("incident_kind")
    # the expected kind counts as the hang where a hang is expected (rank_exited); where none is, it
    # is the incident expected instead (a collective mismatch, a straggler, orphaned memory)
    hangs = [i for i in incidents if i["kind"] in hang_kinds or (expect["hang"] and i["kind"] == want)]
    if not expect["hang"] and hangs:
        out.append(f"false hang incident {[i['kind'] for i in hangs]}")
    if expect["hang"] and not hangs:
        out.append(f"missed hang (incidents: {kinds})")
    if want and (hangs or not expect["hang"]):
        same = [i for i in incidents if i["kind"] == want]
        if not same:
            out.append(f"no {want} incident (got {kinds})")
        else:
            inc, summary = same[0], same[0].get("summary") or ""
            if "culprit_rank" in expect and expect["culprit_rank"] not in (inc.get("culprit_ranks") or []):
                out.append(f"culprit {inc.get('culprit_ranks')} != {expect['culprit_rank']}")
            if "fr_seq_in_incident" in expect and str(expect["fr_seq_in_incident"]) not in json.dumps(inc):
                out.append(f"flight-recorder seq {expect['fr_seq_in_incident']} not cited")
            if "summary_quotes" in expect and expect["summary_quotes"] not in summary:
                out.append(f"cause not quoted ({expect['summary_quotes']!r})")
            if "summary_names_pid" in expect and str(expect["summary_names_pid"]) not in summary:
                out.append(f"pid {expect['summary_names_pid']} (what the culprit waits on) not named")
    if expect.get("one_incident_per_hang") and len(hangs) > 1:
        out.append(f"{len(hangs)} hang incidents for one hang")
    out += [f"opened {k}" for k in expect.get("must_not_open", []) if k in kinds and not (hangs and k in hang_kinds)]
    return out


def gap_key(problem: str) -> str:
    """A missed expectation without the particulars that vary from run to run (the incidents seen):
    "missed hang (incidents: [...])" -> "missed hang"."""
    return problem.split(" (", 1)[0]
