"""The live node: every source behind one runner, and the captures the analysis asks for."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from hangd.analysis.engine import Requests
from hangd.config import Settings
from hangd.snapshot import Action, Snapshot
from hangd.sources.base import CollectorStats, SourceRunner, Unavailable
from hangd.sources.flight import FlightSource
from hangd.sources.nvml import NvmlSource
from hangd.sources.output import OutputSource
from hangd.sources.procfs import ProcSource
from hangd.sources.stacks import StackSource

log = logging.getLogger("hangd.live")


class LiveNode:
    """Samples the node: NVML first (it names the GPU processes), then /proc, logs and dumps."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.nvml = NvmlSource() if settings.nvml else None
        self.proc = ProcSource(proc_root=settings.proc_root, job_env=tuple(settings.job_env))
        self.output = OutputSource(proc_root=settings.proc_root)
        self.flight = FlightSource(proc_root=settings.proc_root)
        self.stacks = StackSource(timeout_s=settings.pyspy_timeout) if settings.stacks else None
        sources: list = [s for s in (self.nvml, self.proc, self.output, self.flight) if s is not None]
        self.runner = SourceRunner(sources)
        self._pending: list[tuple[int, bool]] = []
        self._pending_fr: list[int] = []

    def sample(self) -> Snapshot:
        snap = self.runner.collect()
        self._capture(snap)
        return snap

    def request(self, req: Requests) -> None:
        self._pending.extend(req.stacks)
        self._pending_fr.extend(req.fr_dumps)

    def _capture(self, snap: Snapshot) -> None:
        """Stacks and flight-recorder dumps asked for by the analysis since the last sample."""
        if self._pending_fr:
            for pid in dict.fromkeys(self._pending_fr):
                why = self.flight.request_dump(pid)
                snap.actions.append(Action(what="fr_dump_requested" if why is None else f"fr_dump_not_requested: {why}", pid=pid))
            self._pending_fr = []
        if not self._pending or self.stacks is None:
            self._pending = []
            return
        t0 = time.perf_counter()
        try:
            self.stacks.check()
        except Unavailable as e:
            snap.unavailable["stacks"] = str(e)
            self._pending = []
            return
        for pid, native in dict.fromkeys(self._pending):
            snap.stacks.append(self.stacks.dump(pid, native=native))
        self._pending = []
        st = self.runner.stats.setdefault("stacks", CollectorStats())
        st.duration_s = time.perf_counter() - t0
        st.success = all(s.error is None for s in snap.stacks)

    def dump_stacks(self, pids: Iterable[int], native: bool = False) -> None:
        self._pending.extend((p, native) for p in pids)

    def request_fr_dumps(self, pids: Iterable[int]) -> None:
        self._pending_fr.extend(pids)
