"""Incidents in the store: their writes (with the fleet join) and their reads.

A shared (PostgreSQL) database numbers each node's incidents in a residue class of its own
(``id % ID_STRIDE == node_id % ID_STRIDE``). An open incident of a job that spans nodes holds
``open_key``, unique: the first node to write it owns the row; another node that sees the same hang
joins that row (its own incident is an alias of it) and writes it only once the owner stopped
reporting. Reads overlay the incidents and acknowledgements still queued (writer.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, defer

from hangd.incidents import FAMILY
from hangd.redact import redact_obj, redact_text
from hangd.store import models as m
from hangd.store.base import ID_STRIDE, NODES, Batch, StoreBase

log = logging.getLogger("hangd.store")
LIST_FIELDS = ("evidence", "findings", "timeline")


def incident_row_to_dict(r: m.Incident, with_evidence: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": r.id, "kind": r.kind, "severity": r.severity, "job": r.job, "status": r.status,
        "opened_at": r.opened_at, "updated_at": r.updated_at, "resolved_at": r.resolved_at,
        "hang_started_at": r.hang_started_at, "acked": r.acked, "summary": r.summary, "next_step": r.next_step,
        "pids": r.pids, "ranks": r.ranks, "culprit_pids": r.culprit_pids, "culprit_ranks": r.culprit_ranks,
        "who": r.who,
    }
    if with_evidence:
        d.update({"evidence": r.evidence, "findings": r.findings, "timeline": r.timeline})
    return d


class IncidentRows(StoreBase):
    _joined: set[int]  # this node's incidents that noted, once, that it joined another node's row

    # ------------------------------------------------------------------ writing

    def _write_incidents(self, s: Session, b: Batch) -> None:
        for d in b.incidents:
            family = FAMILY.get(d["kind"], d["kind"])
            open_key = f"{d['job']}/{family}"[:300] if self.shared and d["job"] in b.spanning and \
                d.get("resolved_at") is None else None
            inc = s.get(m.Incident, self._alias.get(d["id"], d["id"]))
            if inc is not None and inc.node_id != self.node_id and d["id"] not in self._alias and inc.job != d["job"]:
                # another node's incident under this id (numbered apart by node id % ID_STRIDE, so only
                # past ID_STRIDE nodes): this one goes under a free id of this node's own
                self._alias[d["id"]] = self._free_id(s)
                inc = None
            if inc is None and open_key is not None:
                inc = self._join(s, d, open_key)
            if inc is not None and inc.node_id != self.node_id:
                if not self._stale(s, inc.node_id, b.t):
                    self._note_join(inc, d, b.t)
                    continue  # the node that opened it tells the story while it reports
                # that node stopped reporting: this one carries on, keeping what the row already says
                before, opened = list(inc.timeline or []), inc.opened_at
                inc.node_id = self.node_id
                self._fill_incident(inc, d, family, open_key)
                inc.opened_at = min(opened, inc.opened_at) if opened is not None and inc.opened_at is not None else opened
                inc.timeline = [*before, {"t": round(b.t, 3), "event": f"{self.hostname} took over: the node that "
                                          "opened it stopped reporting"}]
                continue
            if inc is None:
                try:
                    with s.begin_nested():  # a savepoint: another node may take the open_key first
                        inc = m.Incident(id=self._alias.get(d["id"], d["id"]), node_id=self.node_id, open_key=open_key)
                        self._fill_incident(inc, d, family, open_key)
                        s.add(inc)
                        s.flush()
                except IntegrityError:
                    joined = self._join(s, d, open_key) if open_key is not None else None
                    if joined is None:
                        raise
                    self._note_join(joined, d, b.t)
                continue
            self._fill_incident(inc, d, family, open_key)

    def _free_id(self, s: Session) -> int:
        top = int(s.scalar(select(func.max(m.Incident.id))) or 0) + 1
        return top + (self.node_id - top) % ID_STRIDE

    def _join(self, s: Session, d: dict[str, Any], open_key: str) -> m.Incident | None:
        """Another node's open incident of the same job and family: this node's becomes its alias."""
        row = s.scalar(select(m.Incident).where(m.Incident.open_key == open_key))
        if row is not None and row.node_id != self.node_id:
            self._alias[d["id"]] = row.id
            return row
        return None

    def _note_join(self, inc: m.Incident, d: dict[str, Any], t: float) -> None:
        if d["id"] in self._joined:
            return
        self._joined.add(d["id"])
        inc.timeline = [*(inc.timeline or []), {"t": round(t, 3), "event": f"also seen by {self.hostname}: "
                                                f"{redact_text(d.get('summary') or '')[:300]}"}]

    def _stale(self, s: Session, node_id: int, t: float) -> bool:
        last = s.scalar(select(NODES.c.last_seen).where(NODES.c.id == node_id))
        return last is None or last < t - self.node_stale_s

    def _fill_incident(self, inc: m.Incident, d: dict[str, Any], family: str, open_key: str | None) -> None:
        for k in ("kind", "severity", "job", "opened_at", "updated_at", "resolved_at", "hang_started_at", "pids",
                  "ranks", "culprit_pids", "culprit_ranks"):
            setattr(inc, k, d.get(k))
        # what is stored outlives the process and is served to anyone with the token: the
        # words and evidence are redacted again here, whatever the analysis already did
        for k in ("summary", "next_step", "evidence", "findings", "timeline", "who"):
            setattr(inc, k, redact_obj(d.get(k)))
        inc.family = family
        inc.status = "open" if d.get("resolved_at") is None else "resolved"
        inc.acked = bool(inc.acked) or bool(d.get("acked"))  # an acknowledgement is never taken back
        if open_key is not None or inc.status == "resolved":
            inc.open_key = open_key


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
        overlay = self._overlay()
        queued = [{k: v for k, v in d.items() if k not in LIST_FIELDS} for d in overlay.values()
                  if (not status or d["status"] == status) and (not kind or d.get("kind") == kind)
                  and (not job or d.get("job") == job) and (since is None or (d.get("opened_at") or 0) >= since)]
        if overlay:  # the rows of queued incidents are older than the queue: show the queue's
            q = q.where(m.Incident.id.not_in(list(overlay)))
        with self.Session() as s:
            total = int(s.scalar(select(func.count()).select_from(q.subquery())) or 0)
            # a list shows summaries: leave the (large) evidence, findings and timeline in the table
            q = q.options(defer(m.Incident.evidence), defer(m.Incident.findings), defer(m.Incident.timeline))
            q = q.order_by(m.Incident.opened_at.desc(), m.Incident.id.desc())
            if not queued:
                rows = s.scalars(q.limit(limit).offset(offset))
                return total, [self._acked(incident_row_to_dict(r, with_evidence=False), overlay) for r in rows]
            rows = s.scalars(q.limit(offset + limit))
            merged = [self._acked(incident_row_to_dict(r, with_evidence=False), overlay) for r in rows] + queued
        merged.sort(key=lambda d: (d.get("opened_at") or 0, d["id"]), reverse=True)
        return total + len(queued), merged[offset:offset + limit]


    def get_incident(self, iid: int) -> dict[str, Any] | None:
        overlay = self._overlay()
        if iid in overlay:
            return overlay[iid]
        with self.Session() as s:
            # this node's id of a hang it wrote under another row (the metrics and the analyzer name
            # it so): that row
            r = s.get(m.Incident, self._alias.get(iid, iid))
            return self._acked(incident_row_to_dict(r), overlay) if r is not None else None

    def _ack_row(self, s: Session, iid: int, t: float) -> dict[str, Any] | None:
        r = s.get(m.Incident, iid)
        if r is None:
            return None
        if not r.acked:
            r.acked, r.acked_at = True, t
            r.timeline = [*(r.timeline or []), {"t": round(t, 3), "event": "acked"}]
        return incident_row_to_dict(r)

    def ack(self, iid: int, t: float | None = None) -> dict[str, Any] | None:
        """Acknowledge an incident; None when there is no such incident. While the store is degraded
        (or the incident is still queued) the ack is queued too and shows at once in every read."""
        t = t or time.time()
        iid = self._alias.get(iid, iid)  # a hang this node wrote under another row: that row is acked
        with self._overlay_lock:
            queued = iid in self._unwritten
        if not queued and self.healthy:
            try:
                with self.Session.begin() as s:
                    return self._ack_row(s, iid, t)
            except (SQLAlchemyError, OSError) as e:
                log.warning("ack of incident %d queued: %s", iid, str(e).splitlines()[0][:200])
        try:
            exists = self.get_incident(iid) is not None
        except SQLAlchemyError:
            exists = queued
        if not exists:
            return None
        with self._overlay_lock:
            self._acks.setdefault(iid, t)
        return self.get_incident(iid)

