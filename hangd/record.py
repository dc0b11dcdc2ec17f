"""``hangd record``: write the live node as a ``hangd-trace/1`` bundle.

The same live sources and the same analysis as the daemon run here, so the trace also holds the
stacks and flight-recorder dumps the analysis asked for; ``--stacks-every`` adds periodic stacks
of every rank so a trace always shows what each process was doing.
"""

from __future__ import annotations

import platform
import threading
import time
from typing import Any

from hangd.config import Settings
from hangd.daemon import live_loop
from hangd.snapshot import Snapshot
from hangd.sources.live import LiveNode
from hangd.trace import TraceWriter


def record(settings: Settings, out: str, seconds: float, hz: float, stacks_every: float = 0.0,
           fr_every: float = 0.0, stop: threading.Event | None = None) -> dict[str, Any]:
    loop = live_loop(settings, interval=1.0 / hz, keep_going=False)
    node, front = loop.feed, loop.front
    assert isinstance(node, LiveNode)
    if stop is not None:
        loop.stop = stop
    meta = {"host": {"node": platform.node(), "kernel": platform.release()}, "sample_hz": hz,
            "recorder": "hangd record"}
    unavailable: dict[str, str] = {}
    t_start = time.monotonic()
    last = {"stacks": time.monotonic(), "fr": time.monotonic()}

    def written(snap: Snapshot) -> None:  # as sampled, before the analysis sees it
        w.write(snap)
        unavailable.clear()
        unavailable.update(snap.unavailable)

    def periodic(*_: Any) -> None:
        if stacks_every > 0 and time.monotonic() - last["stacks"] >= stacks_every:
            last["stacks"] = time.monotonic()
            node.dump_stacks(front.job_pids())
        if fr_every > 0 and time.monotonic() - last["fr"] >= fr_every:
            # ask every rank with a dump pipe for a flight-recorder dump: catches silent mismatches
            last["fr"] = time.monotonic()
            node.request_fr_dumps(p for p in front.dumpable_pids() if node.flight.has_pipe(p))

    with TraceWriter(out, meta) as w:
        loop.before_step = written
        loop.run(periodic, seconds=seconds)
        if node.nvml is not None and node.nvml.driver:
            w.meta["host"]["driver"] = node.nvml.driver
    return {"snapshots": loop.ticks, "out": out, "seconds": round(time.monotonic() - t_start, 3),
            "unavailable": unavailable}
