"""``hangd record``: write the live node as a ``hangd-trace/1`` bundle.

The same live sources and the same analysis as the daemon run here, so the trace also holds the
stacks and flight-recorder dumps the analysis asked for; ``--stacks-every`` adds periodic stacks
of every rank so a trace always shows what each process was doing.
"""

from __future__ import annotations

import platform
import time
from typing import Any

from hangd.analysis.engine import Analyzer
from hangd.config import Settings
from hangd.sources.live import LiveNode
from hangd.trace import TraceWriter


def record(settings: Settings, out: str, seconds: float, hz: float, stacks_every: float = 0.0,
           fr_every: float = 0.0, stop: Any = None) -> dict[str, Any]:
    node = LiveNode(settings)
    an = Analyzer()
    interval = 1.0 / hz
    meta = {"host": {"node": platform.node(), "kernel": platform.release()}, "sample_hz": hz,
            "recorder": "hangd record"}
    n = 0
    unavailable: dict[str, str] = {}
    t_start = time.monotonic()
    last_stacks = last_fr = time.monotonic()
    t_end = time.monotonic() + seconds
    with TraceWriter(out, meta) as w:
        next_t = time.monotonic()
        while time.monotonic() < t_end and not (stop is not None and stop.is_set()):
            snap = node.sample()
            w.write(snap)
            unavailable = dict(snap.unavailable)
            an.step(snap)
            node.request(an.take_requests())
            if stacks_every > 0 and time.monotonic() - last_stacks >= stacks_every:
                last_stacks = time.monotonic()
                node.dump_stacks(an.job_pids())
            if fr_every > 0 and time.monotonic() - last_fr >= fr_every:
                # ask every rank with a dump pipe for a flight-recorder dump: catches silent mismatches
                last_fr = time.monotonic()
                node.request_fr_dumps(p for p in an.job_pids() if node.flight.has_pipe(p))
            n += 1
            next_t += interval
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_t = time.monotonic()
        if node.nvml is not None and node.nvml.driver:
            w.meta["host"]["driver"] = node.nvml.driver
    return {"snapshots": n, "out": out, "seconds": round(time.monotonic() - t_start, 3), "unavailable": unavailable}
