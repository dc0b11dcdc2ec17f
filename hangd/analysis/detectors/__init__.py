"""One module per incident family. Each decides on a ``JobView`` and opens, updates or resolves
its incidents through the one ``IncidentBook``; none reads /proc, NVML or another detector's state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hangd.analysis.nodeview import NodeView
from hangd.analysis.progress import ProgressBook
from hangd.analysis.thresholds import Thresholds
from hangd.analysis.views import ProcTrack
from hangd.incidents import IncidentBook


@dataclass
class Env:
    """What detectors share: the thresholds, the node view, the process tracks, progress, the book."""

    th: Thresholds
    view: NodeView
    tracks: dict[int, ProcTrack]
    progress: ProgressBook
    book: IncidentBook
    node: Callable[[], str | None] = field(default=lambda: None)  # this node's name in a fleet, if any
