"""The fleet's reads of a shared (PostgreSQL) database: every node writes its ranks and jobs with
a heartbeat (its node row's ``last_seen``); these read the other nodes' ranks of the jobs that span
nodes (``remote_ranks``, what this node's analysis needs of the ranks it cannot see) and the jobs
as every node reports them (``fleet_jobs``). ``jobs`` is this node's own."""

from __future__ import annotations

import time
from typing import Any, cast

from sqlalchemy import Table, select

from hangd.snapshot import RemoteRank
from hangd.store import models as m
from hangd.store.base import NODE_FORGET_S, NODES, TOUCH_EVERY_S, StoreBase

PROCESSES = cast(Table, m.Process.__table__)
JOBS = cast(Table, m.Job.__table__)


def current(tbl: Table, now: float, heartbeat_s: float) -> list[Any]:
    """Rows a node still lists, of a node heard from within NODE_FORGET_S: not marked gone (a
    node marks what it stops listing), and moved within a touch of the node's own heartbeat
    (what went away while its hangd was down, or in a write that failed, stops moving)."""
    return [tbl.c.gone_at.is_(None), tbl.c.last_seen >= NODES.c.last_seen - TOUCH_EVERY_S - 2 * heartbeat_s - 1,
            NODES.c.last_seen >= now - NODE_FORGET_S]


class FleetReads(StoreBase):
    def jobs(self) -> list[dict[str, Any]]:
        with self.Session() as s:
            rows = s.scalars(select(m.Job).where(m.Job.node_id == self.node_id).order_by(m.Job.last_seen.desc()).limit(200))
            return [{"job": r.key, "name": r.name, "state": r.state, "ranks": r.ranks, "first_seen": r.first_seen,
                     "last_seen": r.last_seen} for r in rows]

    # ------------------------------------------------------------------ the fleet (a shared database)

    def remote_ranks(self, jobs: list[str], now: float | None = None) -> list[RemoteRank]:
        """The ranks other nodes report for these jobs: what the analysis of a job that spans
        nodes needs of the ranks it cannot see."""
        if not jobs or not self.shared:
            return []
        now = now or time.time()
        tbl = PROCESSES
        q = (select(tbl.c.job, NODES.c.hostname, tbl.c.rank, tbl.c.pid, tbl.c.state, tbl.c.reason, tbl.c.waits,
                    tbl.c.last_progress, tbl.c.reading, tbl.c.local, NODES.c.last_seen.label("reported_at"))
             .join(NODES, NODES.c.id == tbl.c.node_id)
             .where(tbl.c.job.in_(sorted(set(jobs))), tbl.c.node_id != self.node_id, *current(tbl, now, self.heartbeat_s)))
        with self.Session() as s:
            return [RemoteRank(job=r.job, node=r.hostname, rank=r.rank, pid=r.pid, state=r.state, reason=r.reason,
                               waits=r.waits, last_progress=r.last_progress, reported_at=r.reported_at, reading=r.reading,
                               local=r.local)
                    for r in s.execute(q)]


    def fleet_jobs(self, key: str | None = None, now: float | None = None) -> dict[str, dict[str, Any]]:
        """The jobs that span nodes as every node reports them: per job, its nodes (each with its
        ranks and when it last reported, and whether it stopped), its ranks with their node, and
        its open incidents. Empty for a database of one node."""
        if not self.shared:
            return {}
        now = now or time.time()
        J, P = JOBS, PROCESSES
        jq = (select(J.c.key, J.c.name, J.c.state, J.c.world_size, J.c.identity, J.c.spans_nodes, NODES.c.hostname,
                     NODES.c.last_seen.label("reported_at"))
              .join(NODES, NODES.c.id == J.c.node_id).where(J.c.spans_nodes.is_not(None), *current(J, now, self.heartbeat_s)))
        if key is not None:
            jq = jq.where(J.c.key == key)
        out: dict[str, dict[str, Any]] = {}
        with self.Session() as s:
            for r in s.execute(jq):
                j = out.setdefault(r.key, {"job": r.key, "name": r.name, "states": [], "world_size": r.world_size,
                                           "identity": r.identity or {}, "spans_nodes": r.spans_nodes, "nodes": {},
                                           "fleet_ranks": {}, "open_incidents": []})
                j["states"].append(r.state)
                j["nodes"][r.hostname] = {"node": r.hostname, "last_report": r.reported_at,
                                          "stale": r.reported_at < now - self.node_stale_s, "ranks": {}}
            if not out:
                return out
            pq = (select(P.c.job, P.c.rank, P.c.pid, P.c.state, P.c.reason, P.c.last_progress, P.c.waits, NODES.c.hostname,
                         NODES.c.last_seen.label("reported_at"))
                  .join(NODES, NODES.c.id == P.c.node_id).where(P.c.job.in_(sorted(out)), *current(P, now, self.heartbeat_s)))
            for pr in s.execute(pq):
                j = out[pr.job]
                node = j["nodes"].get(pr.hostname)
                if node is None or pr.rank is None:
                    continue
                node["ranks"][str(pr.rank)] = pr.pid
                j["fleet_ranks"][str(pr.rank)] = {"node": pr.hostname, "pid": pr.pid, "state": pr.state, "reason": pr.reason,
                                                 "last_progress": pr.last_progress, "waits": pr.waits,
                                                 "reported_at": pr.reported_at}
            for iid, job in s.execute(select(m.Incident.id, m.Incident.job).where(m.Incident.job.in_(sorted(out)),
                                                                                   m.Incident.status == "open")):
                out[job]["open_incidents"].append(iid)
        for j in out.values():
            j["nodes"] = sorted(j["nodes"].values(), key=lambda n: n["node"])
        return out

