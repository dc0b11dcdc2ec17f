"""The recorded traces, decoded and replayed once per test session.

``tests/analysis/test_golden.py`` pins what the analysis says about 25 recorded traces, and the
accuracy tests (``test_accuracy.py``, ``test_accuracy_live_gpu.py``) judge the same 25: reading a
trace (its flight-recorder dumps above all) takes longer than analysing it, so each is read here
once and its snapshots are kept for the session. ``replayed`` is ``hangd replay``: the daemon's
loop (``hangd.daemon.Loop``) over the trace's feed, with the snapshots already read; each trace
is replayed once a session, whichever test asks first.

Snapshots are shared: the analysis only reads them (``test_golden.py`` would fail if a replay
changed what a later one sees). The tests that replay these traces are kept on one pytest-xdist
worker (``WORKER_GROUPS`` in ``tests/conftest.py``) so that they share one cache."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from hangd.analysis.engine import Analyzer
from hangd.daemon import Loop, TraceFeed
from hangd.front import Front
from hangd.snapshot import Snapshot
from hangd.trace import TraceReader


def snapshots(path: Path) -> tuple[Snapshot, ...]:
    """Every snapshot of the trace at ``path``, read once a session."""
    return _snapshots(path.resolve())


@cache
def _snapshots(path: Path) -> tuple[Snapshot, ...]:
    return tuple(TraceReader(path).snapshots())


class _ReadFeed(TraceFeed):
    """The trace's feed (``hangd replay``'s), over the snapshots read already."""

    def __init__(self, path: Path) -> None:
        self.reader = TraceReader(path)
        self._snaps: Iterator[Snapshot] = iter(snapshots(path))


def replayed(path: Path) -> tuple[Analyzer, dict[str, Any]]:
    """``hangd.replay.run_replay(path)``, once a session: the analyzer as the trace left it, and
    the snapshots' count and the trace's meta. The analyzer is shared: read it, do not step it."""
    return _replayed(path.resolve())


@cache
def _replayed(path: Path) -> tuple[Analyzer, dict[str, Any]]:
    an = Analyzer()
    feed = _ReadFeed(path)
    loop = Loop(feed, Front(analyzer=an), keep_going=False)
    loop.run()
    return an, {"snapshots": loop.ticks, "meta": feed.meta}
