"""The row mirror: the processes, jobs and gpus tables hold one row per thing with its newest state.

Most ticks change none of them, and a tick that changes one process's state used to rewrite every
row with a SELECT and an UPDATE each. A ``RowMirror`` remembers what each row of its table holds
(as written, before redaction), writes only the rows that changed, each kind of write in one
executemany statement, and moves the last_seen of the others when asked (every TOUCH_EVERY_S).
One class serves the three tables; what tells them apart is said in its fields.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import CursorResult, Table, bindparam, insert, select, update
from sqlalchemy.orm import Session

from hangd.redact import redact_obj, redact_text
from hangd.store import models as m

PIDS_PER_QUERY = 100
# one thing's values as the mirror compares them, in the order of RowMirror.columns
Values = tuple[Any, ...]


def padded(keys: list[Any]) -> list[list[Any]]:
    """``keys`` in parts of PIDS_PER_QUERY, the last one filled up by repeating its last key."""
    parts = [keys[i:i + PIDS_PER_QUERY] for i in range(0, len(keys), PIDS_PER_QUERY)]
    if parts:
        parts[-1] += parts[-1][-1:] * (PIDS_PER_QUERY - len(parts[-1]))
    return parts


def keep_only(rows: dict[Any, Any], listed: set[Any]) -> None:
    """What the store remembers of rows it wrote, for the things listed now only: under job churn
    a node lists thousands of processes an hour (one that comes back is looked up again)."""
    for key in [k for k in rows if k not in listed]:
        del rows[key]


def updated_all(s: Session, stmt: Any, rows: list[dict[str, Any]]) -> bool:
    """Run an executemany UPDATE; False when it matched fewer rows than given (a row the
    store remembered is not there any more), where the driver counts them."""
    res = cast(CursorResult[Any], s.execute(stmt, rows))
    dialect = s.get_bind().dialect
    if not dialect.supports_sane_multi_rowcount or len(rows) == 1 and not dialect.supports_sane_rowcount:
        return True
    return res.rowcount == len(rows)


@dataclass(slots=True)
class Remembered:
    born: float | None  # first_seen of the row, where the table tells a key's rows apart by it
    values: Values
    gone: bool  # the row is marked gone (gone_at set): it is written again when listed


@dataclass
class RowMirror:
    """One table's rows of this node as the store last wrote (or read) them, keyed by ``key``.

    ``columns``: the value columns, compared as a tuple. ``renew``: a column whose change makes
    another thing of the same key (a pid seen again in another job is another process): a new row
    is inserted, the old one marked gone, and the rows of a key are told apart by ``first_seen``.
    ``stamped``: the table has first_seen, set on insert. ``tracks_gone``: the table has gone_at;
    the rows no longer listed are marked gone at once (the other nodes stop counting them now, not
    when their last_seen is old). ``redact``: columns redacted as written (when not empty)."""

    table: Table
    key: str
    columns: tuple[str, ...]
    renew: str | None = None
    stamped: bool = True
    tracks_gone: bool = True
    redact: tuple[str, ...] = ()
    rows: dict[Any, Remembered] = field(default_factory=dict)

    def forget(self) -> None:
        """What is in the table is read again on the next write: after a failed write (its
        transaction was rolled back), a recreated file, or retention."""
        self.rows.clear()

    def _at(self, key: Any, cur: Remembered) -> dict[str, Any]:
        """The bind parameters that name a remembered row."""
        return {"b_key": key, "b_born": cur.born} if self.renew is not None else {"b_key": key}

    def _look_up(self, s: Session, node_id: int, keys: list[Any]) -> None:
        """The newest row of each key, PIDS_PER_QUERY at a time, always as many: one statement
        text, whatever their number (SQLite keeps every text it prepared, ~25 KiB each, up to 128
        per connection). A row marked gone that is listed again is written again."""
        c = self.table.c
        cols = [c[self.key], *(c[n] for n in self.columns)]
        if self.renew is not None:
            cols.append(c.first_seen)
        if self.tracks_gone:
            cols.append(c.gone_at)
        n = len(self.columns)
        for part in padded(keys):
            q = select(*cols).where(c.node_id == node_id, c[self.key].in_(part))
            if self.renew is not None:
                q = q.order_by(c.first_seen)  # the newest row of a key is the one remembered
            for r in s.execute(q):
                born = r[n + 1] if self.renew is not None else None
                gone = self.tracks_gone and r[-1] is not None
                self.rows[r[0]] = Remembered(born, tuple(r[1:n + 1]), gone)

    def write(self, s: Session, node_id: int, items: list[tuple[Any, Values]], t: float, touch: bool,
              retry: bool = True) -> None:
        """Write the things listed now, ``(key, values)`` each: insert the new ones, update the ones
        that changed, mark gone those no longer listed, and (``touch``) move the last_seen of the
        others to ``t``."""
        tbl, rows = self.table, self.rows
        self._look_up(s, node_id, [k for k, _ in items if k not in rows])
        ri = self.columns.index(self.renew) if self.renew is not None else -1
        new, changed, same, gone = [], [], [], []
        for key, vals in items:
            cur = rows.get(key)
            if cur is not None and not cur.gone and cur.values == vals:
                same.append(self._at(key, cur))
                continue
            row = {n: redact_text(v) if v and n in self.redact else v for n, v in zip(self.columns, vals, strict=True)}
            row["last_seen"] = t
            if self.tracks_gone:
                row["gone_at"] = None
            if cur is None or ri >= 0 and cur.values[ri] != vals[ri]:
                new.append(dict(row, node_id=node_id, **{self.key: key}, **({"first_seen": t} if self.stamped else {})))
                if cur is not None and not cur.gone:  # the row of the one before is gone
                    gone.append(self._at(key, cur))
                rows[key] = Remembered(t, vals, False)
            else:
                changed.append(dict(row, **self._at(key, cur)))
                rows[key] = Remembered(cur.born, vals, False)
        listed = {k for k, _ in items}
        if self.tracks_gone:
            gone += [self._at(k, cur) for k, cur in rows.items() if k not in listed]
        keep_only(rows, listed)
        where = [tbl.c.node_id == node_id, tbl.c[self.key] == bindparam("b_key")]
        if self.renew is not None:
            where.append(tbl.c.first_seen == bindparam("b_born"))
        if new:
            s.execute(insert(tbl), new)
        ok = True
        if gone:
            s.execute(update(tbl).where(*where).values(gone_at=t, last_seen=t), gone)
        if changed:
            written = [*self.columns, "last_seen", *(("gone_at",) if self.tracks_gone else ())]
            ok = updated_all(s, update(tbl).where(*where).values({k: bindparam(k) for k in written}), changed)
        if touch and same:
            ok = updated_all(s, update(tbl).where(*where).values(last_seen=t), same) and ok
        if not ok and retry:  # a row went from under the store (retention): read them all again
            self.forget()
            self.write(s, node_id, items, t, touch, retry=False)


# ------------------------------------------------------------------ the three tables

PROCESS_COLUMNS = ("job", "rank", "state", "since", "reason", "world_size", "last_progress", "waits", "reading",
                   "local")
JOB_COLUMNS = ("name", "state", "ranks", "world_size", "identity", "spans_nodes", "who")
GPU_COLUMNS = ("uuid", "name", "mem_total")


def process_mirror() -> RowMirror:
    return RowMirror(cast(Table, m.Process.__table__), "pid", PROCESS_COLUMNS, renew="job",
                     redact=("reason", "reading"))


def job_mirror() -> RowMirror:
    return RowMirror(cast(Table, m.Job.__table__), "key", JOB_COLUMNS)


def gpu_mirror() -> RowMirror:
    # a node's GPUs are not marked gone: the table has no gone_at (its rows are the node's GPUs)
    return RowMirror(cast(Table, m.Gpu.__table__), "index", GPU_COLUMNS, stamped=False, tracks_gone=False)


def process_items(procs: Iterable[dict[str, Any]], heartbeat_s: float) -> list[tuple[Any, Values]]:
    out = []
    for p in procs:
        # the ranks of a job that spans nodes carry what the other nodes diagnose with (their
        # progress moves often: written only for those, so a single node writes as before)
        fleet = "waits" in p
        # last progress moves on every tick of a working rank: written to the heartbeat's
        # resolution, a rank's row changes once a heartbeat, not once a tick
        lp = p.get("last_progress") if fleet else None
        lp = math.floor(lp / heartbeat_s) * heartbeat_s if lp is not None else None
        out.append((p["pid"], (p.get("job"), p.get("rank"), p.get("state"), p.get("since"), p.get("reason"),
                               p.get("world_size") if fleet else None, lp,
                               p.get("waits") if fleet else None, p.get("reading") if fleet else None,
                               p.get("local") if fleet else None)))
    return out


def job_items(jobs: Iterable[dict[str, Any]]) -> list[tuple[Any, Values]]:
    return [(j["job"], (j.get("name") or j["job"], j.get("state"), j.get("ranks") or {}, j.get("world_size"),
                        j.get("identity"), j.get("spans_nodes"), redact_obj(j.get("who")) or None)) for j in jobs]


def gpu_items(gpus: Iterable[dict[str, Any]]) -> list[tuple[Any, Values]]:
    return [(g["index"], (g.get("uuid"), g.get("name"), g.get("mem_total"))) for g in gpus]
