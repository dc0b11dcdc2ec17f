"""Flight-recorder rows of a shared (PostgreSQL) database: each node writes the newest dump of
every rank of a job that spans nodes (``fr_ranks``, ``fr_entries``); the other nodes read them back
to compare their ranks with these (``remote_dumps``), and ``fleet_flight_recorder`` shows where
every rank of a job stands. What that means across ranks (who is behind, which finding stands) is
decided in ``hangd.analysis.fleetview``."""

from __future__ import annotations

import time
from typing import Any, cast

from sqlalchemy import Table, delete, func, insert, select, update
from sqlalchemy.orm import Session

from hangd.analysis import fleetview
from hangd.flightrec import rows as frrows
from hangd.redact import redact_obj, redact_text
from hangd.snapshot import RemoteDump
from hangd.store import models as m
from hangd.store.base import NODE_FORGET_S, NODES, StoreBase
from hangd.store.rows import keep_only, padded

FR_RANKS = cast(Table, m.FrRank.__table__)
FR_ENTRIES = cast(Table, m.FrEntry.__table__)


class FlightRecorderRows(StoreBase):
    # fr_ranks row id -> (read_at, Dump): a dump is read again only once its node replaced it
    _dump_cache: dict[int, tuple[float, Any]]

    def _write_fr(self, s: Session, fr: dict[tuple[str, int], tuple[float, Any]]) -> None:
        """Each rank's newest dump replaces the one the store held of it: its row is updated in
        place (its id stays, so readers see a new ``read_at``), its entries deleted and written."""
        for (key, rank), (read_at, dump) in fr.items():
            if not frrows.storable_rank(rank):
                continue
            job = key[:255]
            head, entries = frrows.to_rows(dump)
            head["read_at"] = read_at
            row = s.execute(select(FR_RANKS.c.id, FR_RANKS.c.read_at).where(
                FR_RANKS.c.node_id == self.node_id, FR_RANKS.c.job == job, FR_RANKS.c.rank == rank)).first()
            if row is not None and row.read_at > read_at:
                continue  # a newer one is there already
            if row is None:
                dump_id = s.execute(insert(FR_RANKS).values(node_id=self.node_id, job=job, rank=rank, **head)
                                    .returning(FR_RANKS.c.id)).scalar_one()
            else:
                dump_id = row.id
                s.execute(update(FR_RANKS).where(FR_RANKS.c.id == dump_id).values(**head))
                s.execute(delete(FR_ENTRIES).where(FR_ENTRIES.c.dump_id == dump_id))
            if entries:
                s.execute(insert(FR_ENTRIES), [dict(e, dump_id=dump_id) for e in entries])


    def remote_dumps(self, jobs: list[str], now: float | None = None) -> list[RemoteDump]:
        """The flight-recorder dumps other nodes wrote of these jobs' ranks. One small query for
        the ranks' rows; the entries only of dumps not read before (a node replaces a rank's
        row in place when it reads a newer dump: its ``read_at`` moves)."""
        if not jobs or not self.shared:
            return []
        now = now or time.time()
        R = FR_RANKS
        q = (select(R.c.id, R.c.job, R.c.rank, R.c.read_at, NODES.c.hostname, NODES.c.last_seen.label("reported_at"))
             .join(NODES, NODES.c.id == R.c.node_id)
             .where(R.c.job.in_(sorted(set(jobs))), R.c.node_id != self.node_id, NODES.c.last_seen >= now - NODE_FORGET_S))
        cache = self._dump_cache
        with self.Session() as s:
            heads = list(s.execute(q))
            new = [h for h in heads if h.id not in cache or cache[h.id][0] != h.read_at]
            full: dict[int, Any] = {}
            entries: dict[int, list[dict[str, Any]]] = {h.id: [] for h in new}
            for part in padded([h.id for h in new]):
                # the group status (its ranks lists grow with the world) only of the dumps not read before
                for row in s.execute(select(R.c.id, R.c.read_at, R.c.version, R.c.pg_config, R.c.pg_status)
                                     .where(R.c.id.in_(part))):
                    full[row.id] = row
                for e in s.execute(select(FR_ENTRIES).where(FR_ENTRIES.c.dump_id.in_(part)).order_by(FR_ENTRIES.c.id)):
                    entries[e.dump_id].append(e._asdict())
        for h in new:
            got = full.get(h.id)
            if got is None:
                continue  # gone between the two reads (retention)
            # the read_at read before the entries: a dump replaced in between is read whole again next time
            cache[h.id] = (got.read_at, frrows.from_rows(h.rank, {"version": got.version, "pg_config": got.pg_config,
                                                                  "pg_status": got.pg_status}, entries[h.id]))
        heads = [h for h in heads if h.id in cache]
        keep_only(cache, {h.id for h in heads})
        return [RemoteDump(job=h.job, node=h.hostname, rank=h.rank, read_at=cache[h.id][0], reported_at=h.reported_at,
                           dump=cache[h.id][1]) for h in heads]

    def fleet_flight_recorder(self, key: str, now: float | None = None) -> dict[str, Any]:
        """Where every rank of a job that spans nodes stands in its flight recorder, as each node
        (this one too) last wrote its newest dump: ``{"ranks": {rank: [per process group]},
        "findings": [...]}``. Per rank and group: the newest collective it entered (``seq``,
        ``op``, ``sizes``, ``dtypes``, ``state``, ``completed``), the newest it completed
        (``completed_seq``: the dump's group status or its entries, None when neither says),
        ``behind`` (how many collectives the rank furthest on in that group entered after it),
        the newest point-to-point entry (``p2p``, None without one), the node and when that node
        read the dump (``read_at``, Unix seconds of its clock). ``findings`` are the cross-rank
        flight-recorder findings of the job's open incidents. Bounded: one query of the ranks'
        rows (group status, no group config: its rank lists grow with the world), one of at most
        four entries per rank and group (newest collective and point-to-point, each completed or
        not), never frames. Redacted. Empty for a database of one node or a job with no dumps."""
        out: dict[str, Any] = {"ranks": {}, "findings": []}
        if not self.shared:
            return out
        now = now or time.time()
        R, E = FR_RANKS, FR_ENTRIES
        listed = [R.c.job == key[:255], NODES.c.last_seen >= now - NODE_FORGET_S]
        newest = (select(func.max(E.c.id)).select_from(E.join(R, R.c.id == E.c.dump_id).join(NODES, NODES.c.id == R.c.node_id))
                  .where(*listed).group_by(E.c.dump_id, E.c.pg, E.c.is_p2p, E.c.completed))
        with self.Session() as s:
            heads = {h.id: h for h in s.execute(select(R.c.id, R.c.rank, R.c.read_at, R.c.pg_status, NODES.c.hostname)
                                                .join(NODES, NODES.c.id == R.c.node_id).where(*listed))}
            rows = list(s.execute(select(E.c.id, E.c.dump_id, E.c.pg, E.c.seq, E.c.p2p_seq, E.c.op, E.c.state, E.c.completed,
                                         E.c.is_p2p, E.c.input_sizes, E.c.input_dtypes)
                                  .where(E.c.id.in_(newest)).order_by(E.c.id)))
            found = s.execute(select(m.Incident.id, m.Incident.findings).where(m.Incident.job == key,
                                                                               m.Incident.status == "open")).all()
        # pg and op names, dtypes and states come from the job's own dumps: redacted on the way out,
        # each distinct text once (a job's ranks repeat the same few names)
        texts: dict[str, str] = {}

        def clean(v: Any) -> Any:
            if isinstance(v, str):
                if v not in texts:
                    texts[v] = redact_text(v)
                return texts[v]
            return [clean(x) for x in v] if isinstance(v, list) else v

        # per (dump, group): rows come oldest first, so the last one of a kind is the newest
        groups: dict[tuple[int, str], dict[str, Any]] = {}
        for e in rows:
            if e.dump_id not in heads:
                continue  # written between the two reads: read with its head next time
            g = groups.setdefault((e.dump_id, e.pg), {"last": None, "done": None, "p2p": None})
            if e.is_p2p:
                g["p2p"] = e
            else:
                g["last"] = e
                if e.completed:
                    g["done"] = e
        ranks: dict[int, list[dict[str, Any]]] = {}
        for (dump_id, pg), g in sorted(groups.items(), key=lambda kv: (heads[kv[0][0]].rank, kv[0][1])):
            h, last, p2p = heads[dump_id], g["last"], g["p2p"]
            status = (h.pg_status or {}).get(pg) if isinstance(h.pg_status, dict) else None
            said = status.get("last_completed_collective") if isinstance(status, dict) else None
            done_seq = fleetview.newest_completed(said, g["done"].seq if g["done"] is not None else None)
            ranks.setdefault(h.rank, []).append({
                "node": clean(h.hostname), "pg": clean(pg), "read_at": h.read_at,
                "seq": last.seq if last else None, "op": clean(last.op) if last else None,
                "sizes": clean(last.input_sizes) if last else None, "dtypes": clean(last.input_dtypes) if last else None,
                "state": clean(last.state) if last else None, "completed": last.completed if last else None,
                "completed_seq": done_seq, "behind": None,
                "p2p": {"seq": p2p.p2p_seq, "op": clean(p2p.op), "state": clean(p2p.state), "completed": p2p.completed}
                if p2p else None})
        every = [x for xs in ranks.values() for x in xs]
        for x, behind in zip(every, fleetview.behind_furthest((x["pg"], x["seq"]) for x in every), strict=True):
            x["behind"] = behind
        out["ranks"] = {str(r): ranks[r] for r in sorted(ranks)}
        seen: set[str] = set()
        for iid, findings in sorted(found):
            for f in findings or []:
                if not isinstance(f, dict) or f.get("source") != "flight_recorder" or str(f.get("message")) in seen:
                    continue
                seen.add(str(f.get("message")))
                out["findings"].append(redact_obj({"incident": iid, "kind": f.get("kind"), "pg": f.get("pg"),
                                                   "seq": f.get("seq"), "message": str(f.get("message") or "")}))
        out["findings"] = fleetview.standing_findings(out["findings"])
        return out

