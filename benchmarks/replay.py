"""Replay speed over the reference traces: events/s and how many times faster than real time.

python -m benchmarks.replay [--json] -> {"events_per_second", "speedup_vs_real_time", ...}
Each trace is replayed 3 times; the best run counts (the machine is shared and noisy)."""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.common import emit
from hangd.replay import run_replay
from hangd.trace import TraceReader

TRACES = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces"


def main() -> None:
    per: dict[str, float] = {}
    events = 0
    span = 0.0
    wall = 0.0
    for d in sorted(p for p in TRACES.glob("*/*") if (p / "meta.json").exists()):
        r = TraceReader(d)
        n = sum(1 for _ in r.events())
        t = [float(r.meta.get("t_start") or 0), float(r.meta.get("t_end") or 0)]
        best = min(_timed(d) for _ in range(3))
        events += n
        span += t[1] - t[0]
        wall += best
        per[f"{d.parent.name}/{d.name}_speedup"] = round((t[1] - t[0]) / best, 1)
    emit({"events_per_second": round(events / wall), "speedup_vs_real_time": round(span / wall, 1),
          "traces": len(per), "events": events, "trace_seconds": round(span, 1), "replay_seconds": round(wall, 3),
          "slowest_trace_speedup": min(per.values())}, "replay speed (all reference traces, best of 3)")


def _timed(d: Path) -> float:
    t0 = time.perf_counter()
    run_replay(str(d))
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
