"""The analyzer behind one lock.

``Front`` owns an ``Analyzer`` and the lock that guards it: the loop thread steps it, the API,
/metrics and the commands read it, and every read is a typed record copied out under the lock
(``ProcessRecord``, ``JobRecord``, ``GpuRecord``, and ``Incident`` copies), so no reader holds the
lock or sees the analysis change under it.

The loop that steps it is ``hangd.daemon.Loop``.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hangd.analysis.engine import Analyzer, StateChange
from hangd.analysis.thresholds import Thresholds
from hangd.incidents import Incident
from hangd.snapshot import GpuSample, Snapshot

if TYPE_CHECKING:
    from hangd.daemon import Feed

# the fields a rank of a job that spans nodes also has: what the other nodes diagnose with
FLEET_FIELDS = ("world_size", "waits", "local", "reading")


@dataclass(frozen=True)
class ProcessRecord:
    """One GPU process / rank as the analysis sees it now."""

    pid: int
    rank: int | None
    rank_from: str | None
    job: str
    state: str
    since: float
    reason: str
    gpus: list[int]
    gpu_mem_bytes: int | None  # None: no GPU reading (unknown, not 0)
    cpu_cores: float | None
    last_progress: float | None
    last_progress_why: str
    command: str | None
    log_grew_at: float | None
    # its evidence record, per source (gpu_work, cpu_own_code, read, write, log, collectives,
    # stack, children): "yes: what moved", "no", or "unknown" where the source is missing
    moved: dict[str, str] = dataclasses.field(default_factory=dict)
    fleet: dict[str, Any] | None = None  # FLEET_FIELDS, for a rank of a job that spans nodes

    @classmethod
    def of(cls, d: dict[str, Any]) -> ProcessRecord:
        fleet = {k: d[k] for k in FLEET_FIELDS if k in d}
        # a report of an older hangd (another node, a stored row) has no evidence record
        return cls(**{k: d[k] for k in _PROCESS_FIELDS if k in d or k != "moved"}, fleet=fleet or None)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape the API, the store and ``hangd status --json`` give."""
        return {**(self.fleet or {}), **{k: getattr(self, k) for k in _PROCESS_FIELDS}}


@dataclass(frozen=True)
class JobRecord:
    """One distributed job (its ranks on this node) and its state."""

    job: str
    name: str | None
    state: str
    ranks: dict[str, int]  # rank -> pid
    rank_from: dict[str, str | None]
    identity: dict[str, Any]
    world_size: int | None
    launcher: str | None
    last_progress: float | None
    spans_nodes: str | None = None  # set only for a job with ranks on other nodes
    who: dict[str, Any] | None = None  # who to page (owner, Slurm job, pod), set only when known

    @classmethod
    def of(cls, d: dict[str, Any]) -> JobRecord:
        return cls(**{k: d[k] for k in _JOB_FIELDS}, spans_nodes=d.get("spans_nodes"), who=d.get("who"))

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in _JOB_FIELDS}
        if self.spans_nodes:
            d["spans_nodes"] = self.spans_nodes
        if self.who:
            d["who"] = self.who
        return d


@dataclass(frozen=True)
class GpuRecord:
    """The newest reading of one GPU."""

    index: int
    uuid: str | None
    name: str | None
    util_gpu: int | None
    util_mem: int | None
    mem_used: int | None
    mem_total: int | None
    power_w: float | None
    temp_c: int | None
    sm_clock: int | None
    gpm: dict[str, float] | None
    processes: list[dict[str, Any]]
    health: dict[str, Any] = dataclasses.field(default_factory=dict)  # XIDs, clock events, ECC, remaps, NVLink

    @classmethod
    def of(cls, d: dict[str, Any]) -> GpuRecord:
        names = {f.name for f in dataclasses.fields(cls)} - {"health"}
        return cls(**{k: v for k, v in d.items() if k in names}, health={k: v for k, v in d.items() if k not in names})

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "health"}, **self.health}


_PROCESS_FIELDS = tuple(f.name for f in dataclasses.fields(ProcessRecord) if f.name != "fleet")
_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(JobRecord) if f.name not in ("spans_nodes", "who"))


def _copy(inc: Incident) -> Incident:
    """An incident as it is now, for a reader: the analysis goes on changing its own."""
    return dataclasses.replace(inc, pids=list(inc.pids), ranks=list(inc.ranks), culprit_pids=list(inc.culprit_pids),
                               culprit_ranks=list(inc.culprit_ranks), evidence=dict(inc.evidence),
                               findings=list(inc.findings), timeline=list(inc.timeline))


class Front:
    """The analyzer and its lock. Everything outside the analysis goes through here."""

    def __init__(self, thresholds: Thresholds | None = None, analyzer: Analyzer | None = None) -> None:
        self.analyzer = analyzer if analyzer is not None else Analyzer(thresholds)
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ the loop's side

    def step(self, snap: Snapshot, feed: Feed) -> tuple[list[StateChange], list[Incident]]:
        """One snapshot in: the state changes, the captures asked of ``feed``, the incidents changed."""
        with self._lock:
            changes = self.analyzer.step(snap)
            feed.request(self.analyzer.take_requests())
            return changes, self.analyzer.drain()

    def drain(self) -> list[Incident]:
        with self._lock:
            return self.analyzer.drain()

    def take_fr_dumps(self) -> dict[tuple[str, int], tuple[float, Any]]:
        with self._lock:
            return self.analyzer.take_fr_dumps()

    def adopt(self, records: list[dict[str, Any]], next_id: int) -> None:
        with self._lock:
            self.analyzer.adopt(records, next_id)

    def number_by(self, step: int, offset: int) -> None:
        with self._lock:
            self.analyzer.book.number_by(step, offset)

    def resolve_adopted(self, t: float) -> None:
        with self._lock:
            if self.analyzer.has_adopted():
                self.analyzer.resolve_adopted(t)

    # ------------------------------------------------------------------ the readers' side

    def processes(self) -> list[ProcessRecord]:
        with self._lock:
            return [ProcessRecord.of(d) for d in self.analyzer.processes()]

    def jobs(self) -> list[JobRecord]:
        with self._lock:
            return [JobRecord.of(d) for d in self.analyzer.jobs()]

    def gpus(self) -> list[GpuRecord]:
        with self._lock:
            return [GpuRecord.of(d) for d in self.analyzer.gpus()]

    def latest_gpus(self) -> dict[int, GpuSample]:
        """The newest NVML sample of every GPU (samples are never changed once taken)."""
        with self._lock:
            return self.analyzer.latest_gpus()

    def incident(self, incident_id: int) -> Incident | None:
        with self._lock:
            inc = self.analyzer.incident(incident_id)
            return _copy(inc) if inc is not None else None

    def incidents(self, open_only: bool = False) -> list[Incident]:
        with self._lock:
            return [_copy(i) for i in self.analyzer.incidents(open_only=open_only)]

    def ack(self, incident_id: int) -> None:
        with self._lock:
            self.analyzer.ack(incident_id)

    def xid_totals(self) -> dict[tuple[int, str, int], int]:
        """XIDs each GPU reported since start: (GPU index, uuid, XID) -> count."""
        with self._lock:
            return dict(self.analyzer.view.hw.totals)

    def opened_counts(self) -> dict[str, int]:
        with self._lock:
            return self.analyzer.opened_counts()

    def forgotten(self) -> dict[str, int]:
        with self._lock:
            return self.analyzer.forgotten()

    def unreadable(self) -> int:
        """Evidence files (flight-recorder dumps) refused or undecodable since start."""
        with self._lock:
            return self.analyzer.unreadable

    def job_nodes(self) -> dict[str, dict[str, tuple[float, int]]]:
        with self._lock:
            return self.analyzer.job_nodes()

    def job_pids(self) -> list[int]:
        with self._lock:
            return self.analyzer.job_pids()

    def dumpable_pids(self) -> list[int]:
        """The job pids a flight-recorder dump may be asked of: none of a job that may be
        capturing CUDA graphs (a dump kills a capturing rank: analysis.asks.capturing)."""
        with self._lock:
            return self.analyzer.dumpable_pids()

    def spanning_jobs(self) -> set[str]:
        with self._lock:
            return self.analyzer.spanning_jobs()

    def cmdline(self, pid: int) -> list[str] | None:
        with self._lock:
            return self.analyzer.cmdline(pid)
