"""The one loop of hangd: take a snapshot from a ``Feed`` (a live node, or a recorded trace), step
the analysis, hand the captures it asks for back to the feed, drain the incidents that changed.
``hangd serve`` (live and ``--replay``), ``replay``, ``record``, ``status`` and ``watch`` all run it."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from hangd.analysis.engine import StateChange
from hangd.config import Settings, thresholds_from
from hangd.evidence import Requests
from hangd.front import Front
from hangd.incidents import Incident
from hangd.snapshot import Snapshot
from hangd.trace import TraceReader

log = logging.getLogger("hangd.daemon")


class Feed(Protocol):
    """Where snapshots come from: a live node (``hangd.sources.live.LiveNode``) or a trace."""

    live: bool  # a live node's sampling is part of a tick's cost; a trace's reading is not

    def sample(self) -> Snapshot | None:
        """The next snapshot; None when there are no more (a trace ended)."""

    def request(self, req: Requests) -> None:
        """Capture what the analysis asked for (stacks, dumps); a trace captures nothing."""


class TraceFeed:
    """A recorded trace as a feed, at ``speed`` times real time (0: as fast as it reads)."""

    live = False

    def __init__(self, path: str, speed: float = 0.0) -> None:
        self.reader = TraceReader(path)
        self._snaps = paced(self.reader.snapshots(), speed)

    @property
    def meta(self) -> dict[str, Any]:
        return self.reader.meta

    def sample(self) -> Snapshot | None:
        return next(self._snaps, None)

    def request(self, req: Requests) -> None:
        pass  # a replay cannot capture anything new


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


Tick = tuple[Snapshot, list[StateChange], list[Incident]]


class Loop:
    """Feed -> analysis, one tick every ``interval`` seconds (None: as fast as the feed gives).

    ``on_tick`` sees the snapshot, the state changes and the incidents that changed. With
    ``keep_going`` (the daemon) a failing tick is logged and counted and the loop goes on;
    without (the one-shot commands) it raises."""

    def __init__(self, feed: Feed, front: Front, interval: float | None = None, keep_going: bool = True,
                 stop: threading.Event | None = None) -> None:
        self.feed = feed
        self.front = front
        self.interval = interval
        self.keep_going = keep_going
        self.stop = stop if stop is not None else threading.Event()
        self.tick_seconds: list[float] = []
        self.ticks = 0
        self.tick_failures = 0
        self.last_failure: tuple[float, str] | None = None  # (when, the exception's line)
        # sees each snapshot before the analysis does: fills in what comes from elsewhere than
        # this node (other nodes' ranks from a shared store), or writes it to a trace
        self.before_step: Callable[[Snapshot], None] | None = None

    def tick(self) -> Tick | None:
        """One snapshot through the analysis; None when the feed has no more."""
        t0 = time.perf_counter()
        snap = self.feed.sample()
        if snap is None:
            return None
        if not self.feed.live:
            t0 = time.perf_counter()
        if self.before_step is not None:
            self.before_step(snap)
        changes, incidents = self.front.step(snap, self.feed)
        self.tick_seconds.append(time.perf_counter() - t0)
        del self.tick_seconds[:-1000]
        self.ticks += 1
        return snap, changes, incidents

    def run(self, on_tick: Callable[[Snapshot, list[StateChange], list[Incident]], None] | None = None,
            seconds: float | None = None, ticks: int | None = None) -> None:
        """Until stopped, ``seconds`` have passed, ``ticks`` ticks ran, or the feed ended."""
        deadline = time.monotonic() + seconds if seconds else None
        next_t = time.monotonic()
        done = 0
        while not self.stop.is_set() and (deadline is None or time.monotonic() < deadline):
            try:
                out = self.tick()
                if out is None:
                    return
                if on_tick is not None:
                    on_tick(*out)
            except Exception:  # the daemon's loop outlives anything one tick throws
                if not self.keep_going:
                    raise
                self.tick_failures += 1
                self.last_failure = (time.time(), traceback.format_exc(limit=1).strip().splitlines()[-1][:300])
                log.exception("tick failed")
            done += 1
            if ticks is not None and done >= ticks:
                return
            if self.interval is None:
                continue
            next_t += self.interval
            delay = next_t - time.monotonic()
            if delay > 0:
                self.stop.wait(delay)
            else:
                next_t = time.monotonic()


def configured_front(settings: Settings) -> Front:
    """The analysis with the configured thresholds: what serve, status, record and watch judge with."""
    return Front(thresholds_from(settings))


def live_loop(settings: Settings, interval: float | None = None, keep_going: bool = True) -> Loop:
    """This node through the configured analysis, sampled every ``interval`` seconds (default: the
    ``interval`` setting). The loop's feed is the ``LiveNode``."""
    from hangd.sources.live import LiveNode

    return Loop(LiveNode(settings), configured_front(settings), interval=interval or settings.interval,
                keep_going=keep_going)
