"""The live node: every source behind one runner, and the captures the analysis asks for."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from hangd.config import Settings
from hangd.evidence import Requests, decode_evidence
from hangd.snapshot import Action, RasReport, Snapshot, StackSample
from hangd.sources import ras
from hangd.sources.base import CollectorStats, Disabled, SourceRunner, Unavailable
from hangd.sources.flight import FlightSource
from hangd.sources.nvml import NvmlSource
from hangd.sources.output import OutputSource
from hangd.sources.procfs import ProcSource
from hangd.sources.stacks import PTRACE_HINT, StackSource

log = logging.getLogger("hangd.live")


class LiveNode:
    """Samples the node: NVML first (it names the GPU processes), then /proc, logs and dumps."""

    live = True  # a feed of hangd.daemon.Loop: sampling is part of a tick's cost

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.nvml = NvmlSource() if settings.nvml else None
        self.proc = ProcSource(proc_root=settings.proc_root, job_env=tuple(settings.job_env),
                               cgroup_path=settings.cgroup_path, pod_log_dir=settings.pod_log_dir)
        self.output = OutputSource(proc_root=settings.proc_root)
        self.flight = FlightSource(proc_root=settings.proc_root)
        self.stacks = StackSource(timeout_s=settings.pyspy_timeout) if settings.stacks else None
        sources: list = [s for s in (self.nvml, self.proc, self.output, self.flight, self.stacks) if s is not None]
        if self.nvml is None:
            sources.insert(0, Disabled("nvml", "turned off by the setting nvml = false (HANGD_NVML=0)",
                                       "HINT: unset HANGD_NVML or set nvml = true to see GPUs"))
        if self.stacks is None:
            sources.append(Disabled("stacks", "turned off by the setting stacks = false (HANGD_STACKS=0): host-side "
                                    "hangs go unseen", "HINT: unset HANGD_STACKS or set stacks = true"))
        self.runner = SourceRunner(sources)
        self._pending: list[tuple[int, bool]] = []
        self._pending_fr: list[int] = []
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hangd-stacks")
        self._inflight: dict[Future[StackSample], int] = {}
        self._ras: Future[str | None] | None = None

    def sample(self) -> Snapshot:
        snap = self.runner.collect()
        self._capture(snap)
        return decode_evidence(snap)

    def request(self, req: Requests) -> None:
        self.flight.teach(req.ranks)
        self._pending.extend(req.stacks)
        self._pending_fr.extend(req.fr_dumps)
        self._pending_fr.extend(p for p in req.fr_probes if self.flight.has_pipe(p))
        if req.ras and (self._ras is None or self._ras.done()):
            # NCCL's RAS answers for every NCCL process of the node; a stopped rank can make it slow
            self._ras = self._pool.submit(ras.query, ras.DEFAULT_ADDR, 15.0)

    def _capture(self, snap: Snapshot) -> None:
        """Captures the analysis asked for. Stacks are taken on worker threads so a slow py-spy
        (or a --native dump that pauses its target) never stalls the sampling tick; finished
        dumps join the next snapshot."""
        if self._pending_fr:
            for pid in dict.fromkeys(self._pending_fr):
                why = self.flight.request_dump(pid)
                snap.actions.append(Action(what="fr_dump_requested" if why is None else f"fr_dump_not_requested: {why}", pid=pid))
            self._pending_fr = []
        if self._ras is not None and self._ras.done():
            text = self._ras.result()
            self._ras = None
            if text:
                snap.ras.append(RasReport(format="text", text=text))
        done = [f for f in self._inflight if f.done()]
        for f in done:
            del self._inflight[f]
            try:
                snap.stacks.append(f.result())
            except Exception as e:  # py-spy itself failing is reported, not raised
                log.warning("stack capture failed: %s", e)
        if self._pending and self.stacks is not None:
            try:
                self.stacks.check()
            except Unavailable as e:
                snap.unavailable["stacks"] = str(e)
                self._pending = []
        st = self.runner.stats.setdefault("stacks", CollectorStats())
        if snap.stacks:
            st.duration_s = max((s.seconds or 0.0) for s in snap.stacks)
            st.success = all(s.error is None for s in snap.stacks)
            if self.stacks is not None:  # said on every tick until the next captures (the source's collect)
                # refused (ptrace): the node cannot take stacks; a process that exited meanwhile is no failure
                self.stacks.last_error = next((s.error for s in snap.stacks if s.error and PTRACE_HINT in s.error), None)
        if not self._pending or self.stacks is None:
            self._pending = []
            return
        busy = set(self._inflight.values())
        for pid, native in dict.fromkeys(self._pending):
            if pid in busy:
                continue  # one capture of a process at a time
            self._inflight[self._pool.submit(self.stacks.dump, pid, native)] = pid
            busy.add(pid)
        self._pending = []

    def dump_stacks(self, pids: Iterable[int], native: bool = False) -> None:
        self._pending.extend((p, native) for p in pids)

    def request_fr_dumps(self, pids: Iterable[int]) -> None:
        self._pending_fr.extend(pids)
