"""One module per incident family. Each decides on a ``JobView`` and opens, updates or resolves
its incidents through the one ``IncidentBook``; none reads /proc, NVML or another detector's state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hangd.analysis.facts.waits import same_wait_point
from hangd.analysis.nodeview import NodeView
from hangd.analysis.progress import ProgressBook
from hangd.analysis.signals import ProcSignals
from hangd.analysis.thresholds import Thresholds
from hangd.analysis.views import ProcTrack
from hangd.evidence import Requests
from hangd.incidents import IncidentBook


@dataclass
class Env:
    """What the stages after the readings share: the thresholds, the node view, the process tracks,
    progress, the incident book, and what the analysis asks the sources for next. A plain record of
    the engine's views: detectors and helpers take it, never the Analyzer."""

    th: Thresholds
    view: NodeView
    tracks: dict[int, ProcTrack]
    progress: ProgressBook
    book: IncidentBook
    node: Callable[[], str | None] = field(default=lambda: None)  # this node's name in a fleet, if any
    requests: Requests = field(default_factory=Requests)  # what to ask the sources for at the next tick
    capturing_jobs: set[str] = field(default_factory=set)  # jobs that may be capturing CUDA graphs: no dumps

    def track(self, pid: int) -> ProcTrack:
        """The process's track, a new one if it has none yet."""
        p = self.tracks.get(pid)
        if p is None:
            p = self.tracks[pid] = ProcTrack()
        return p

    def last_wait(self, pid: int, s: ProcSignals, t: float) -> str | None:
        """The kind of wait its last stack showed, while it stays at the same kernel wait point."""
        p = self.track(pid)
        if p.verdict_t is None or t - p.verdict_t > self.th.verdict_known_s:
            return None
        if not same_wait_point(p.verdict_wchan, s, self.th):
            return None
        return p.verdict.kind
