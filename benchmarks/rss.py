"""RSS of ``hangd serve`` over time while it watches N real processes at 1 Hz.

python -m benchmarks.rss [--json] [--processes 64] [--seconds 600] [--every 15]
-> {"rss_mb": [[seconds, MB], ...], "rss_mb_end", "rss_mb_per_hour_history_full", "rss_mb_1h_extrapolated"}

The analysis keeps Thresholds.history_readings (HISTORY) (2 minutes at 1 Hz) of each process, so RSS grows for the
first minutes and should then stay flat; the slope once the history is full (from HISTORY + 60 s
on), carried to one hour, is the extrapolation reported when the run is shorter than an hour.
"""

from __future__ import annotations

import sys
import time

import psutil

from benchmarks.common import emit
from benchmarks.overhead import started, stopped
from hangd.analysis.thresholds import Thresholds

HISTORY = Thresholds.history_readings


def main() -> None:
    n = int(sys.argv[sys.argv.index("--processes") + 1]) if "--processes" in sys.argv else 64
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 600.0
    every = float(sys.argv[sys.argv.index("--every") + 1]) if "--every" in sys.argv else 15.0
    run = started(n)
    try:
        p = psutil.Process(run.serve.pid)
        t0 = time.monotonic()
        series = []
        while time.monotonic() - t0 < seconds:
            series.append((round(time.monotonic() - t0), round(p.memory_info().rss / 1e6, 1)))
            time.sleep(every)
        series.append((round(time.monotonic() - t0), round(p.memory_info().rss / 1e6, 1)))
    finally:
        stopped(run)
    full = [x for x in series if x[0] >= HISTORY + 60]
    slope = (full[-1][1] - full[0][1]) / max(full[-1][0] - full[0][0], 1) * 3600 if len(full) >= 2 else 0.0
    end = series[-1][1]
    emit({"processes": n, "seconds": series[-1][0], "rss_mb": series, "rss_mb_end": end,
          "rss_mb_per_hour_history_full": round(slope, 1),
          "rss_mb_1h_extrapolated": round(end + max(0.0, slope) * max(0.0, 3600 - series[-1][0]) / 3600, 1)},
         f"hangd serve RSS over {seconds:.0f} s, {n} processes")


if __name__ == "__main__":
    main()
