"""Replay a recorded trace through the very same analysis as a live node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hangd.analysis.engine import Analyzer
from hangd.analysis.thresholds import Thresholds
from hangd.daemon import Loop, TraceFeed
from hangd.evidence import words as ras_words
from hangd.front import Front
from hangd.humanize import iso_field, iso_local
from hangd.snapshot import Snapshot


def run_replay(path: str, speed: float = 0.0, thresholds: Thresholds | None = None,
               on_snapshot: Callable[[Analyzer, Snapshot], None] | None = None) -> tuple[Analyzer, dict[str, Any]]:
    """The trace through the analysis, by the daemon's loop; the analyzer as the trace left it."""
    an = Analyzer(thresholds)
    feed = TraceFeed(path, speed)
    loop = Loop(feed, Front(analyzer=an), keep_going=False)
    loop.run(None if on_snapshot is None else lambda snap, *_: on_snapshot(an, snap))
    return an, {"snapshots": loop.ticks, "meta": feed.meta}


def replay_result(an: Analyzer) -> dict[str, Any]:
    """The ``hangd replay --json`` shape: Unix seconds, and ``*_iso`` next to an incident's times."""
    incidents = []
    for i in an.incidents():
        d = i.to_dict()
        d.update({f"{k}_iso": iso_field(d.get(k)) for k in ("opened_at", "updated_at", "resolved_at", "hang_started_at")})
        incidents.append(d)
    return {
        "states": [{k: v for k, v in c.to_dict().items() if k != "evidence"} for c in an.changes],
        "incidents": incidents,
        "findings": list(an.findings),
    }


def describe_finding(f: dict[str, Any]) -> str:
    """A finding in words. Flight-recorder findings carry their sentence; an NCCL RAS answer is
    numbers, said here: which rank launched how many operations, and who is behind."""
    if f.get("message"):
        return str(f["message"])
    if f.get("kind") == "nccl_ras":
        text = ras_words(f)
        behind = f.get("behind") or []
        if behind:
            text += "; behind: " + ", ".join(f"rank {x['rank']}" for x in behind)
        missing = f.get("missing") or []
        if missing:
            text += "; no data from " + ", ".join(f"{x['ranks']} rank(s) of pid {x['pid']}" for x in missing)
        return text
    return ", ".join(f"{k}={v}" for k, v in f.items() if k not in ("t", "kind", "source")) or "-"


def render_replay(res: dict[str, Any], info: dict[str, Any], path: str) -> str:
    """``hangd replay`` for a person: every event at its local time and its offset into the trace;
    each incident with its summary and the next step."""
    t0 = info["meta"].get("t_start") or (res["states"][0]["t"] if res["states"] else 0)
    lines = [f"{info['snapshots']} snapshots from {path}, recorded from {iso_local(t0) if t0 else '-'}"]
    events: list[tuple[float, str]] = []
    for c in res["states"]:
        events.append((c["t"], f"pid {c['pid']:>7} rank {c['rank']!s:>3}  {c['state']:<13} {c['reason']}"))
    for inc in res["incidents"]:
        text = (f"INCIDENT #{inc['id']} {inc['kind']} ({inc['severity']}) opened: job {inc['job']}, culprit ranks "
                f"{inc['culprit_ranks']} (pids {inc['culprit_pids']})\n{'':>37}{inc['summary']}")
        if inc.get("next_step"):
            text += f"\n{'':>37}next step: {inc['next_step']}"
        events.append((inc["opened_at"], text))
        if inc["resolved_at"] is not None:
            events.append((inc["resolved_at"], f"INCIDENT #{inc['id']} resolved after "
                           f"{inc['resolved_at'] - inc['opened_at']:.0f} s: {inc['timeline'][-1].get('note', '')}"))
    for f in res["findings"]:
        events.append((f["t"], f"FINDING {f['kind']}: {describe_finding(f)}"))
    for t, text in sorted(events, key=lambda e: e[0]):
        lines.append(f"{iso_local(t)} {t - t0:+8.1f}s  {text}")
    if not res["incidents"] and not res["findings"]:
        lines.append("No incident and no finding in this trace.")
    return "\n".join(lines)
