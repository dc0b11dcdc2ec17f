"""Incidents: what went wrong with a job, who is to blame, and the evidence, opened, updated and
resolved by the analysis. One incident per job per episode and family."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class IncidentKind(StrEnum):
    NCCL_STALL = "nccl_stall"
    HOST_STALL = "host_stall"
    IO_STALL = "io_stall"
    ORPHANED_GPU_MEMORY = "orphaned_gpu_memory"
    COLLECTIVE_MISMATCH = "collective_mismatch"
    STRAGGLER = "straggler"
    RANK_EXITED = "rank_exited"


class Family(StrEnum):
    """Incidents of one family are one episode: a job has at most one open incident per family, and
    a hang that changes kind (host_stall -> nccl_stall, a rank exits) stays the same incident."""

    HANG = "hang"
    ORPHAN = "orphan"
    MISMATCH = "mismatch"
    STRAGGLER = "straggler"


class Severity(StrEnum):
    CRITICAL = "critical"  # the job makes no progress or computes wrong results: page someone
    WARNING = "warning"  # GPUs are wasted or a job runs slower: look during the day


_K = IncidentKind
KINDS = tuple(k.value for k in IncidentKind)
HANG_KINDS = (_K.NCCL_STALL.value, _K.HOST_STALL.value, _K.IO_STALL.value)
FAMILY: dict[str, Family] = {_K.NCCL_STALL: Family.HANG, _K.HOST_STALL: Family.HANG, _K.IO_STALL: Family.HANG,
                             _K.RANK_EXITED: Family.HANG, _K.ORPHANED_GPU_MEMORY: Family.ORPHAN,
                             _K.COLLECTIVE_MISMATCH: Family.MISMATCH, _K.STRAGGLER: Family.STRAGGLER}
SEVERITY: dict[str, Severity] = {
    _K.NCCL_STALL: Severity.CRITICAL, _K.HOST_STALL: Severity.CRITICAL, _K.IO_STALL: Severity.CRITICAL,
    _K.RANK_EXITED: Severity.CRITICAL, _K.ORPHANED_GPU_MEMORY: Severity.WARNING,
    _K.COLLECTIVE_MISMATCH: Severity.CRITICAL, _K.STRAGGLER: Severity.WARNING}
NEXT_STEP: dict[str, str] = {
    _K.NCCL_STALL: ("Look at what the culprit rank is doing (its stack below) instead of killing the job; "
                   "the ranks inside the collective are only waiting for it. Compare code paths that "
                   "issue collectives conditionally (data-dependent branches, different step counts)."),
    _K.HOST_STALL: ("The ranks are blocked on the host, not on a GPU. Read the culprit's stack: "
                   "a rank waiting on something other than the collective (an event, a lock, a queue) "
                   "never reached the collective its peers are in. Do not send SIGABRT: the stacks here "
                   "are the evidence."),
    _K.IO_STALL: "A rank is stuck in uninterruptible I/O: check the filesystem (NFS/Lustre/disk) it reads.",
    _K.RANK_EXITED: ("A rank exited while its peers still hold GPUs and will wait for it until their "
                    "collective timeout: read the exited rank's last log lines, then stop the job."),
    _K.ORPHANED_GPU_MEMORY: ("These processes lost their launcher and still hold GPU memory: stop them "
                            "(hangd never does) to free the GPUs."),
    _K.COLLECTIVE_MISMATCH: ("Ranks issued different collectives at the same sequence number: results are "
                            "silently wrong or the job will hang. Check shapes and step counts per rank."),
    _K.STRAGGLER: "One rank repeatedly makes the others wait: check its data loading, host and GPU.",
}


@dataclass
class Incident:
    id: int
    kind: str
    job: str
    opened_at: float
    severity: str = Severity.CRITICAL
    resolved_at: float | None = None
    updated_at: float | None = None
    pids: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    culprit_pids: list[int] = field(default_factory=list)
    culprit_ranks: list[int] = field(default_factory=list)
    summary: str = ""
    next_step: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    hang_started_at: float | None = None
    acked: bool = False
    # whom to page: the job's owner, Slurm job and pod (hangd.analysis.owner.who), as known
    who: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return FAMILY.get(self.kind, self.kind)

    @property
    def open(self) -> bool:
        return self.resolved_at is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "kind": str(self.kind), "severity": str(self.severity), "job": self.job,
            "status": "open" if self.open else "resolved",
            "opened_at": round(self.opened_at, 3),
            "resolved_at": round(self.resolved_at, 3) if self.resolved_at is not None else None,
            "updated_at": round(self.updated_at, 3) if self.updated_at is not None else None,
            "hang_started_at": round(self.hang_started_at, 3) if self.hang_started_at is not None else None,
            "pids": self.pids, "ranks": self.ranks, "culprit_pids": self.culprit_pids,
            "culprit_ranks": self.culprit_ranks, "summary": self.summary_with_who(), "next_step": self.next_step,
            "evidence": {**self.evidence, "who": self.who} if self.who else self.evidence,
            "findings": self.findings, "timeline": self.timeline, "acked": self.acked,
            **({"who": self.who} if self.who else {}),
        }

    def summary_with_who(self) -> str:
        """The summary, then whose job it is (``Owner alice, Slurm job 1234 (...).``)."""
        text = self.who.get("text") if self.who else None
        if not text:
            return self.summary
        sentence = text[:1].upper() + text[1:] + "."
        if sentence in self.summary:
            return self.summary
        return f"{self.summary.rstrip()} {sentence}" if self.summary else sentence


# defaults of Thresholds.incident_refresh_s and .timeline_kept (the reasons are there); the
# analysis hands its own in
REFRESH_S = 10.0
TIMELINE_KEPT = 50
_DURATION = re.compile(r"\d+(?:\.\d+)? s\b")


class IncidentBook:
    """Open incidents by (job, family), and every incident ever opened in this run."""

    def __init__(self, first_id: int = 1, keep_resolved: int = 500, refresh_s: float = REFRESH_S,
                 timeline_kept: int = TIMELINE_KEPT) -> None:
        self.next_id = first_id
        self.refresh_s, self.timeline_kept = refresh_s, timeline_kept
        self.open: dict[tuple[str, str], Incident] = {}
        # every open incident and the newest resolved ones (the store keeps them all)
        self.recent: deque[Incident] = deque()
        self.keep_resolved = keep_resolved
        self.dropped = 0  # resolved incidents dropped from memory
        self.changed: list[Incident] = []  # touched since the last drain()
        self.adopted: dict[tuple[str, str], Incident] = {}  # open in the store when hangd started
        self._fingerprint: dict[int, tuple[Any, ...]] = {}
        self._marked_at: dict[int, float] = {}
        self.opened_by_kind: dict[str, int] = {}  # incidents opened since start, by kind (a counter)
        # a database several nodes share: each numbers its incidents id % id_step == id_offset
        self.id_step = 1
        self.id_offset = 0
        # the owner, Slurm job and pod of a job, by its key (the analysis sets it; None: unknown)
        self.who_of: Callable[[str], dict[str, Any] | None] = lambda job: None

    def number_by(self, step: int, offset: int) -> None:
        """Number new incidents ``offset``, ``offset + step``, ... (from next_id on)."""
        self.id_step, self.id_offset = max(1, step), offset % max(1, step)
        self._align()

    def _align(self) -> None:
        self.next_id += (self.id_offset - self.next_id) % self.id_step

    @property
    def all(self) -> list[Incident]:
        """The incidents still in memory, oldest first."""
        return list(self.recent)

    def find(self, incident_id: int) -> Incident | None:
        return next((i for i in self.recent if i.id == incident_id), None) or \
            next((i for i in self.adopted.values() if i.id == incident_id), None)

    def ack(self, incident_id: int) -> Incident | None:
        inc = self.find(incident_id)
        if inc is not None:
            inc.acked = True
        return inc

    def _remember(self, inc: Incident) -> None:
        self.recent.append(inc)
        resolved = sum(1 for i in self.recent if not i.open)
        while resolved > self.keep_resolved:
            old = next(i for i in self.recent if not i.open)
            self.recent.remove(old)
            self._fingerprint.pop(old.id, None)
            self._marked_at.pop(old.id, None)
            self.dropped += 1
            resolved -= 1

    def adopt(self, d: dict[str, Any]) -> Incident:
        """An incident still open from before a restart: the same episode continues under its id."""
        inc = Incident(id=int(d["id"]), kind=d["kind"], job=d["job"], opened_at=float(d["opened_at"]),
                       severity=d.get("severity") or Severity.CRITICAL, updated_at=d.get("updated_at"),
                       pids=list(d.get("pids") or []), ranks=list(d.get("ranks") or []),
                       culprit_pids=list(d.get("culprit_pids") or []), culprit_ranks=list(d.get("culprit_ranks") or []),
                       summary=d.get("summary") or "", next_step=d.get("next_step") or "",
                       evidence=dict(d.get("evidence") or {}), findings=list(d.get("findings") or []),
                       timeline=list(d.get("timeline") or []), hang_started_at=d.get("hang_started_at"),
                       acked=bool(d.get("acked")), who=dict(d.get("who") or {}))
        self.adopted[(inc.job, inc.family)] = inc
        self.next_id = max(self.next_id, inc.id + 1)
        self._align()
        return inc

    def get(self, job: str, family: str) -> Incident | None:
        return self.open.get((job, family))

    def open_incident(self, kind: str, job: str, t: float, **kw: Any) -> Incident:
        old = self.adopted.pop((job, FAMILY.get(kind, kind)), None)
        if old is not None:
            old.updated_at = t
            old.timeline.append({"t": round(t, 3), "event": "updated", "note": "still going on after hangd restarted"})
            self.open[(job, old.family)] = old
            if old not in self.recent:
                self.recent.append(old)
            self.changed.append(old)
            return old
        inc = Incident(id=self.next_id, kind=kind, job=job, opened_at=t, severity=SEVERITY.get(kind, Severity.WARNING),
                       next_step=NEXT_STEP.get(kind, ""), updated_at=t, who=dict(self.who_of(job) or {}), **kw)
        self.next_id += self.id_step
        inc.timeline.append({"t": round(t, 3), "event": "opened", "kind": kind})
        self.open[(job, inc.family)] = inc
        self.opened_by_kind[kind] = self.opened_by_kind.get(kind, 0) + 1
        self._remember(inc)
        self.changed.append(inc)
        return inc

    def touch(self, inc: Incident, t: float, note: str | None = None) -> None:
        """Record that ``inc`` was refreshed; it counts as changed (for stores and watchers) only
        when ``note`` says something new happened."""
        inc.updated_at = t
        if not inc.who:  # its ranks' facts came after it opened
            inc.who = dict(self.who_of(inc.job) or {})
        if note and not any(e.get("note") == note for e in inc.timeline):
            inc.timeline.append({"t": round(t, 3), "event": "updated", "note": note})
            del inc.timeline[1:-self.timeline_kept]
            if inc not in self.changed:
                self.changed.append(inc)
        # What a person reads changed (kind, culprits, the summary's words): every view must show it
        # now. Counters in the summary ("has waited 41 s") tick every second: those are brought up
        # to date every refresh_s, not written on every tick.
        fp = (inc.kind, _DURATION.sub("N s", inc.summary), tuple(inc.culprit_pids), tuple(inc.culprit_ranks),
              tuple(inc.pids), inc.next_step, len(inc.findings), inc.who.get("text"))
        stale = t - self._marked_at.get(inc.id, t) >= self.refresh_s
        if self._fingerprint.get(inc.id) != fp or stale:
            self._fingerprint[inc.id] = fp
            self._marked_at[inc.id] = t
            if inc not in self.changed:
                self.changed.append(inc)

    def resolve(self, inc: Incident, t: float, why: str) -> None:
        if inc.resolved_at is not None:
            return
        inc.resolved_at = t
        inc.updated_at = t
        inc.timeline.append({"t": round(t, 3), "event": "resolved", "note": why})
        self.open.pop((inc.job, inc.family), None)
        if inc not in self.changed:
            self.changed.append(inc)

    def drain(self) -> list[Incident]:
        out, self.changed = self.changed, []
        return out
