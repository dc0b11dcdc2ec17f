"""Replay a recorded trace through the very same analysis as a live node."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from hangd.analysis.engine import Analyzer
from hangd.analysis.signals import Thresholds
from hangd.snapshot import Snapshot
from hangd.trace import TraceReader


def paced(snaps: Iterator[Snapshot], speed: float) -> Iterator[Snapshot]:
    """Yield snapshots at ``speed`` times real time (0 or less: as fast as possible)."""
    t0_wall = time.monotonic()
    t0_trace: float | None = None
    for s in snaps:
        if speed > 0:
            if t0_trace is None:
                t0_trace = s.t
            due = t0_wall + (s.t - t0_trace) / speed
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        yield s


def run_replay(path: str, speed: float = 0.0, thresholds: Thresholds | None = None,
               on_snapshot: Callable[[Analyzer, Snapshot], None] | None = None) -> tuple[Analyzer, dict[str, Any]]:
    reader = TraceReader(path)
    an = Analyzer(thresholds)
    n = 0
    for snap in paced(reader.snapshots(), speed):
        an.step(snap)
        an.take_requests()  # a replay cannot capture anything new
        n += 1
        if on_snapshot is not None:
            on_snapshot(an, snap)
    return an, {"snapshots": n, "meta": reader.meta}


def replay_result(an: Analyzer) -> dict[str, Any]:
    """The ``hangd replay --json`` shape."""
    return {
        "states": [{k: v for k, v in c.to_dict().items() if k != "evidence"} for c in an.changes],
        "incidents": [i.to_dict() for i in an.incidents()],
        "findings": list(an.findings),
    }
