"""The loop of a live hangd: sample the node, analyze, capture what the analysis asks for."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable

from hangd.analysis.engine import Analyzer, StateChange
from hangd.analysis.signals import Thresholds
from hangd.config import Settings
from hangd.incidents import Incident
from hangd.snapshot import Snapshot
from hangd.sources.live import LiveNode

log = logging.getLogger("hangd.daemon")


def thresholds_from(settings: Settings) -> Thresholds:
    return Thresholds(hang_gpu_s=settings.hang_gpu_s, hang_host_s=settings.hang_host_s, hang_io_s=settings.hang_io_s,
                      gone_after_s=settings.gone_after_s, node_stale_s=settings.node_stale_s)


class Loop:
    """One tick every ``interval`` seconds; ``on_tick`` sees the snapshot, the state changes and
    the incidents that changed. Never raises out of a tick: a failing tick is logged and counted."""

    def __init__(self, settings: Settings, node: LiveNode | None = None, analyzer: Analyzer | None = None,
                 lock: threading.RLock | None = None) -> None:
        self.settings = settings
        self.node = node or LiveNode(settings)
        self.analyzer = analyzer or Analyzer(thresholds_from(settings))
        self.stop = threading.Event()
        self.tick_seconds: list[float] = []
        self.ticks = 0
        self.tick_failures = 0
        self.last_failure: tuple[float, str] | None = None  # (when, the exception's line)
        self.lock = lock or threading.RLock()
        # fills in what comes from elsewhere than this node (other nodes' ranks from a shared store)
        self.before_step: Callable[[Snapshot], None] | None = None

    def tick(self) -> tuple[Snapshot, list[StateChange], list[Incident]]:
        t0 = time.perf_counter()
        snap = self.node.sample()
        if self.before_step is not None:
            self.before_step(snap)
        with self.lock:
            changes = self.analyzer.step(snap)
            self.node.request(self.analyzer.take_requests())
            incidents = self.analyzer.drain()
        dt = time.perf_counter() - t0
        self.tick_seconds.append(dt)
        del self.tick_seconds[:-1000]
        self.ticks += 1
        return snap, changes, incidents

    def run(self, on_tick: Callable[[Snapshot, list[StateChange], list[Incident]], None] | None = None,
            seconds: float | None = None) -> None:
        interval = self.settings.interval
        deadline = time.monotonic() + seconds if seconds else None
        next_t = time.monotonic()
        while not self.stop.is_set() and (deadline is None or time.monotonic() < deadline):
            try:
                out = self.tick()
                if on_tick is not None:
                    on_tick(*out)
            except Exception:  # the loop outlives anything one tick throws
                self.tick_failures += 1
                self.last_failure = (time.time(), traceback.format_exc(limit=1).strip().splitlines()[-1][:300])
                log.exception("tick failed")
            next_t += interval
            delay = next_t - time.monotonic()
            if delay > 0:
                self.stop.wait(delay)
            else:
                next_t = time.monotonic()
