"""The recorded traces, decoded and replayed once per test session.

``tests/analysis/test_golden.py`` pins what the analysis says about 25 recorded traces, and the
accuracy tests (``test_accuracy.py``, ``test_accuracy_live_gpu.py``) judge the same 25: reading a
trace (its flight-recorder dumps above all) takes longer than analysing it, so each is read here
once and its snapshots are kept for the session. ``replayed`` is ``hangd replay``: the daemon's
loop (``hangd.daemon.Loop``) over the trace's feed, with the snapshots already read; each trace
is replayed once a session, whichever test asks first.

Snapshots are shared: the analysis only reads them (``test_golden.py`` would fail if a replay
changed what a later one sees). The tests that replay these traces are kept on one pytest-xdist
worker (``WORKER_GROUPS`` in ``tests/conftest.py``) so that they share one cache.

``result`` is what a replay says (``hangd replay --json``), once a session, for the tests that judge
only that: the job matrix (``test_matrix.py``), the held-back traces (``test_held_back_traces.py``)
and the baseline of every recording (``test_baseline.py``), which judges them all again. It keeps no
snapshot and no analyzer of its own: there are two hundred recordings and more."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from hangd.analysis.engine import Analyzer
from hangd.daemon import Loop, TraceFeed
from hangd.front import Front
from hangd.replay import replay_result, run_replay
from hangd.snapshot import Snapshot
from hangd.trace import TraceReader


def snapshots(path: Path) -> tuple[Snapshot, ...]:
    """Every snapshot of the trace at ``path``, read once a session."""
    return _snapshots(path.resolve())


# the traces whose snapshots are read, and those replayed() holds the analyzer of
_read: set[Path] = set()
_held: set[Path] = set()


@cache
def _snapshots(path: Path) -> tuple[Snapshot, ...]:
    snaps = tuple(TraceReader(path).snapshots())
    _read.add(path)
    return snaps


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
    _held.add(path)
    return an, {"snapshots": loop.ticks, "meta": feed.meta}


def result(path: Path) -> dict[str, Any]:
    """``hangd.replay.replay_result`` of the trace's replay, once a session: from the analyzer
    ``replayed`` holds where a test asked for it or its snapshots are read already (``test_golden.py``
    reads its traces' when collected), else from a replay of its own that keeps only the result."""
    return _result(path.resolve())


@cache
def _result(path: Path) -> dict[str, Any]:
    an = _replayed(path)[0] if path in _held or path in _read else run_replay(str(path))[0]
    return replay_result(an)
