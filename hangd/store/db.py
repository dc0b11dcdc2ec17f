"""The store: incidents, the state timeline, processes, jobs, GPUs and downsampled GPU history.

SQLite by default (WAL, busy timeout); any SQLAlchemy URL works (PostgreSQL is tested). Writes
come from the loop thread in batches; a batch that fails (database locked, disk full, read-only)
stays queued, bounded, and is retried on the next tick, so hangd keeps diagnosing and serving
and catches up when the database comes back.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, create_engine, delete, event, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, defer, sessionmaker

from hangd.incidents import FAMILY
from hangd.redact import redact_obj, redact_text
from hangd.store import models as m

log = logging.getLogger("hangd.store")
MIGRATIONS = Path(__file__).resolve().parent.parent.parent / "migrations"
MAX_PENDING = 20_000


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        path = url[len("sqlite:///"):]
        if path:
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    eng = create_engine(url, pool_pre_ping=True, future=True)
    if eng.dialect.name == "sqlite":
        @event.listens_for(eng, "connect")
        def _sqlite_pragmas(conn: Any, _rec: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=2000")
            cur.close()
    return eng


def _alembic(url: str, action: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    eng = make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    with eng.begin() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, revision)


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the Alembic migrations (``hangd db upgrade``; also done at every start)."""
    if not MIGRATIONS.is_dir():  # installed without the source tree: create the tables as the head has them
        m.Base.metadata.create_all(make_engine(url))
        return
    _alembic(url, "upgrade", revision)


def downgrade(url: str, revision: str = "base") -> None:
    _alembic(url, "downgrade", revision)


def incident_row_to_dict(r: m.Incident, with_evidence: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": r.id, "kind": r.kind, "severity": r.severity, "job": r.job, "status": r.status,
        "opened_at": r.opened_at, "updated_at": r.updated_at, "resolved_at": r.resolved_at,
        "hang_started_at": r.hang_started_at, "acked": r.acked, "summary": r.summary, "next_step": r.next_step,
        "pids": r.pids, "ranks": r.ranks, "culprit_pids": r.culprit_pids, "culprit_ranks": r.culprit_ranks,
    }
    if with_evidence:
        d.update({"evidence": r.evidence, "findings": r.findings, "timeline": r.timeline})
    return d


@dataclass
class Batch:
    t: float
    incidents: list[dict[str, Any]] = field(default_factory=list)
    changes: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] | None = None
    jobs: list[dict[str, Any]] | None = None
    gpus: list[dict[str, Any]] | None = None


class Store:
    def __init__(self, url: str, hostname: str | None = None, migrate: bool = True) -> None:
        self.url = url
        if migrate:
            upgrade(url)
        self.engine = make_engine(url)
        self.Session = sessionmaker(self.engine, expire_on_commit=False)
        self.hostname = hostname or socket.gethostname()
        self.pending: deque[Batch] = deque()
        self.dropped = 0
        self.healthy = True
        self.last_error: str | None = None
        self.write_failures_total = 0
        self._lock = threading.Lock()
        self._last_log = 0.0
        self._gpu_acc: dict[tuple[int, int], list[tuple[float | None, float | None, float | None, float | None]]] = {}
        self.node_id: int = 0
        try:
            self.node_id = self._node()
        except SQLAlchemyError as e:  # a full disk or a locked file at start: serve anyway, write later
            self.healthy, self.last_error = False, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            log.error("store not writable at start (will retry): %s", self.last_error)

    def _node(self) -> int:
        now = time.time()
        with self.Session.begin() as s:
            n = s.scalar(select(m.Node).where(m.Node.hostname == self.hostname))
            if n is None:
                n = m.Node(hostname=self.hostname, first_seen=now, last_seen=now)
                s.add(n)
                s.flush()
            return int(n.id)

    # ------------------------------------------------------------------ writing

    def submit(self, batch: Batch) -> None:
        """Queue a batch and try to write everything queued. Never raises."""
        with self._lock:
            self.pending.append(batch)
            while len(self.pending) > MAX_PENDING:
                self.pending.popleft()
                self.dropped += 1
            self._flush()

    def submit_flush(self) -> None:
        with self._lock:
            self._flush()
        if self.pending:
            time.sleep(0.2)

    def _flush(self) -> None:
        while self.pending:
            b = self.pending[0]
            try:
                if not self.node_id:
                    self.node_id = self._node()
                with self.Session.begin() as s:
                    self._write(s, b)
            except (SQLAlchemyError, OSError) as e:
                self.healthy = False
                self.write_failures_total += 1
                self.last_error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                if time.time() - self._last_log > 60:
                    self._last_log = time.time()
                    log.error("store write failed (%d batches queued, will retry): %s", len(self.pending), self.last_error)
                return
            self.pending.popleft()
            if not self.healthy:
                log.warning("store writes work again; caught up")
            self.healthy, self.last_error = True, None

    def _write(self, s: Session, b: Batch) -> None:
        self._write_incidents(s, b)
        for c in b.changes:
            s.add(m.StateChange(node_id=self.node_id, t=c["t"], pid=c["pid"], rank=c.get("rank"), job=c.get("job"),
                                state=c["state"], reason=redact_text(c["reason"])))
        if b.processes is not None:
            self._write_processes(s, b.processes, b.t)
        if b.jobs is not None:
            self._write_jobs(s, b.jobs, b.t)
        if b.gpus is not None:
            self._write_gpus(s, b.gpus, b.t)
        n = s.get(m.Node, self.node_id)
        if n is not None:
            n.last_seen = b.t

    def _write_incidents(self, s: Session, b: Batch) -> None:
        for d in b.incidents:
            inc = s.get(m.Incident, d["id"])
            if inc is None:
                inc = m.Incident(id=d["id"], node_id=self.node_id)
                s.add(inc)
            for k in ("kind", "severity", "job", "opened_at", "updated_at", "resolved_at", "hang_started_at", "pids",
                      "ranks", "culprit_pids", "culprit_ranks"):
                setattr(inc, k, d.get(k))
            # what is stored outlives the process and is served to anyone with the token: the
            # words and evidence are redacted again here, whatever the analysis already did
            for k in ("summary", "next_step", "evidence", "findings", "timeline"):
                setattr(inc, k, redact_obj(d.get(k)))
            inc.family = FAMILY.get(d["kind"], d["kind"])
            inc.status = "open" if d.get("resolved_at") is None else "resolved"

    def _write_processes(self, s: Session, procs: list[dict[str, Any]], t: float) -> None:
        for p in procs:
            proc = s.scalar(select(m.Process).where(m.Process.node_id == self.node_id, m.Process.pid == p["pid"])
                            .order_by(m.Process.first_seen.desc()).limit(1))
            if proc is None or proc.job != p.get("job"):
                proc = m.Process(node_id=self.node_id, pid=p["pid"], first_seen=t)
                s.add(proc)
            proc.job, proc.rank, proc.state, proc.since, proc.reason, proc.last_seen = (
                p.get("job"), p.get("rank"), p.get("state"), p.get("since"), redact_text(p["reason"]) if p.get("reason") else p.get("reason"), t)

    def _write_jobs(self, s: Session, jobs: list[dict[str, Any]], t: float) -> None:
        for j in jobs:
            job = s.scalar(select(m.Job).where(m.Job.node_id == self.node_id, m.Job.key == j["job"]))
            if job is None:
                job = m.Job(node_id=self.node_id, key=j["job"], first_seen=t)
                s.add(job)
            job.name, job.state, job.ranks, job.last_seen = j.get("name") or j["job"], j.get("state"), j.get("ranks") or {}, t

    def _write_gpus(self, s: Session, gpus: list[dict[str, Any]], t: float) -> None:
        for g in gpus:
            gpu = s.scalar(select(m.Gpu).where(m.Gpu.node_id == self.node_id, m.Gpu.index == g["index"]))
            if gpu is None:
                gpu = m.Gpu(node_id=self.node_id, index=g["index"])
                s.add(gpu)
            gpu.uuid, gpu.name, gpu.mem_total, gpu.last_seen = g.get("uuid"), g.get("name"), g.get("mem_total"), t
            self._gpu_minute(s, g, t)

    def _gpu_minute(self, s: Session, g: dict[str, Any], t: float) -> None:
        """Downsample GPU readings to one row per GPU per minute (written when the minute ends)."""
        minute = int(t // 60)
        key = (g["index"], minute)
        acc = self._gpu_acc.setdefault(key, [])
        acc.append((g.get("util_gpu"), (g.get("gpm") or {}).get("SM_UTIL"), g.get("power_w"), g.get("mem_used")))
        for (idx, mn) in [k for k in self._gpu_acc if k[1] < minute]:
            vals = self._gpu_acc.pop((idx, mn))

            def mean(i: int, vals: list[Any] = vals) -> float | None:
                xs = [v[i] for v in vals if v[i] is not None]
                return sum(xs) / len(xs) if xs else None
            exists = s.scalar(select(m.GpuMinute.id).where(m.GpuMinute.node_id == self.node_id,
                                                           m.GpuMinute.gpu_index == idx, m.GpuMinute.minute == mn))
            if exists is None:
                s.add(m.GpuMinute(node_id=self.node_id, gpu_index=idx, minute=mn, util=mean(0), sm=mean(1),
                                  power_w=mean(2), mem_used=mean(3)))

    def retention(self, days: float, now: float | None = None) -> int:
        """Delete history older than ``days``; open incidents are kept whatever their age."""
        cutoff = (now or time.time()) - days * 86400
        try:
            with self.Session.begin() as s:
                n = 0
                for stmt in (delete(m.StateChange).where(m.StateChange.t < cutoff),
                             delete(m.GpuMinute).where(m.GpuMinute.minute < int(cutoff // 60)),
                             delete(m.Incident).where(m.Incident.status == "resolved", m.Incident.resolved_at < cutoff),
                             delete(m.Process).where(m.Process.last_seen < cutoff),
                             delete(m.Job).where(m.Job.last_seen < cutoff)):
                    n += cast(CursorResult[Any], s.execute(stmt)).rowcount or 0
            return int(n)
        except SQLAlchemyError as e:
            log.error("retention failed: %s", e)
            return 0

    # ------------------------------------------------------------------ reading

    def open_incidents(self) -> list[dict[str, Any]]:
        with self.Session() as s:
            rows = s.scalars(select(m.Incident).where(m.Incident.node_id == self.node_id, m.Incident.status == "open"))
            return [incident_row_to_dict(r) for r in rows]

    def max_incident_id(self) -> int:
        with self.Session() as s:
            return int(s.scalar(select(func.max(m.Incident.id))) or 0)

    def list_incidents(self, status: str | None = None, kind: str | None = None, job: str | None = None,
                       since: float | None = None, limit: int = 50, offset: int = 0) -> tuple[int, list[dict[str, Any]]]:
        q = select(m.Incident)
        if status:
            q = q.where(m.Incident.status == status)
        if kind:
            q = q.where(m.Incident.kind == kind)
        if job:
            q = q.where(m.Incident.job == job)
        if since is not None:
            q = q.where(m.Incident.opened_at >= since)
        with self.Session() as s:
            total = int(s.scalar(select(func.count()).select_from(q.subquery())) or 0)
            # a list shows summaries: leave the (large) evidence, findings and timeline in the table
            q = q.options(defer(m.Incident.evidence), defer(m.Incident.findings), defer(m.Incident.timeline))
            rows = s.scalars(q.order_by(m.Incident.opened_at.desc(), m.Incident.id.desc()).limit(limit).offset(offset))
            return total, [incident_row_to_dict(r, with_evidence=False) for r in rows]

    def get_incident(self, iid: int) -> dict[str, Any] | None:
        with self.Session() as s:
            r = s.get(m.Incident, iid)
            return incident_row_to_dict(r) if r is not None else None

    def ack(self, iid: int, t: float | None = None) -> dict[str, Any] | None:
        t = t or time.time()
        with self.Session.begin() as s:
            r = s.get(m.Incident, iid)
            if r is None:
                return None
            r.acked, r.acked_at = True, t
            r.timeline = [*(r.timeline or []), {"t": round(t, 3), "event": "acked"}]
            return incident_row_to_dict(r)

    def timeline(self, pid: int | None = None, since: float | None = None, limit: int = 500) -> list[dict[str, Any]]:
        q = select(m.StateChange)
        if pid is not None:
            q = q.where(m.StateChange.pid == pid)
        if since is not None:
            q = q.where(m.StateChange.t >= since)
        with self.Session() as s:
            rows = s.scalars(q.order_by(m.StateChange.t.desc()).limit(limit))
            return [{"t": r.t, "pid": r.pid, "rank": r.rank, "job": r.job, "state": r.state, "reason": r.reason}
                    for r in rows][::-1]

    def jobs(self) -> list[dict[str, Any]]:
        with self.Session() as s:
            rows = s.scalars(select(m.Job).where(m.Job.node_id == self.node_id).order_by(m.Job.last_seen.desc()).limit(200))
            return [{"job": r.key, "name": r.name, "state": r.state, "ranks": r.ranks, "first_seen": r.first_seen,
                     "last_seen": r.last_seen} for r in rows]

    def gpu_history(self, index: int, since: float) -> list[dict[str, Any]]:
        with self.Session() as s:
            rows = s.scalars(select(m.GpuMinute).where(m.GpuMinute.gpu_index == index, m.GpuMinute.minute >= int(since // 60))
                             .order_by(m.GpuMinute.minute))
            return [{"t": r.minute * 60, "util": r.util, "sm": r.sm, "power_w": r.power_w, "mem_used": r.mem_used} for r in rows]

    def size_bytes(self) -> int | None:
        if self.engine.dialect.name == "sqlite" and self.engine.url.database:
            p = self.engine.url.database
            return sum(os.path.getsize(x) for x in (p, p + "-wal") if os.path.exists(x))
        return None

