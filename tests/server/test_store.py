"""The store on real SQLite and a real PostgreSQL: migrations both ways, retention, a live serve."""

from __future__ import annotations

import time

from sqlalchemy import create_engine, inspect

from hangd.store.db import Batch, Store, downgrade, upgrade

from ..conftest import TRACES
from .conftest import serve

TABLES = {"nodes", "gpus", "jobs", "processes", "state_changes", "incidents", "gpu_minutes", "alembic_version"}


def _tables(url: str) -> set[str]:
    return set(inspect(create_engine(url)).get_table_names())


def _migrate_both_ways(url: str) -> None:
    upgrade(url)
    assert _tables(url) >= TABLES
    downgrade(url, "base")
    assert _tables(url) <= {"alembic_version"}
    upgrade(url)
    assert _tables(url) >= TABLES


def test_sqlite_migrations_up_and_down(tmp_path):
    _migrate_both_ways(f"sqlite:///{tmp_path / 'm.db'}")


def test_postgres_migrations_up_and_down(postgres_url):
    _migrate_both_ways(postgres_url)


def _incident(iid: int, t: float, status_resolved: bool = False) -> dict:
    return {"id": iid, "kind": "host_stall", "severity": "critical", "job": "j", "opened_at": t, "updated_at": t,
            "resolved_at": t + 1 if status_resolved else None, "summary": "s", "next_step": "", "pids": [1],
            "ranks": [0], "culprit_pids": [1], "culprit_ranks": [0], "evidence": {"x": 1}, "findings": [], "timeline": []}


def test_retention_keeps_open_incidents(tmp_path):
    st = Store(f"sqlite:///{tmp_path / 'r.db'}")
    old = time.time() - 40 * 86400
    st.submit(Batch(t=old, incidents=[_incident(1, old, True), _incident(2, old)],
                    changes=[{"t": old, "pid": 1, "rank": 0, "job": "j", "state": "busy", "reason": "r"}]))
    st.submit(Batch(t=time.time(), changes=[{"t": time.time(), "pid": 1, "rank": 0, "job": "j", "state": "idle", "reason": "r"}]))
    assert st.retention(30) >= 2
    assert st.get_incident(1) is None and st.get_incident(2) is not None
    assert [e["state"] for e in st.timeline(pid=1)] == ["idle"]


def test_serve_on_postgres(tmp_path, served, postgres_url):
    s = serve(tmp_path, "--replay", str(TRACES / "cpu_hang"), "--speed", "20", db=postgres_url)
    served.append(s)
    incs = s.wait_for(lambda s: s.get("/incidents").json()["incidents"], 30, "an incident in PostgreSQL")
    assert incs[0]["kind"] == "host_stall"
    assert s.get(f"/incidents/{incs[0]['id']}").json()["evidence"]["stacks"]


def test_a_store_slower_than_the_ticks_keeps_one_list_of_the_processes(tmp_path):
    """While the database cannot take writes (another process holds it locked), every tick still
    queues its state changes, but only the newest list of the processes stays queued: memory does
    not grow with the ticks' lists of hundreds of processes. When the lock goes, everything is
    written and the processes table holds the newest list."""
    import sqlite3

    from sqlalchemy import text

    db = tmp_path / "slow.db"
    st = Store(f"sqlite:///{db}")
    st.start_writer()
    lock = sqlite3.connect(db, timeout=1)
    lock.execute("BEGIN EXCLUSIVE")
    t0 = time.time()
    try:
        for i in range(40):
            t = t0 + i
            procs = [{"pid": 1000 + p, "job": "j", "rank": p, "state": "busy", "since": t0, "reason": "r"}
                     for p in range(300)]
            st.submit(Batch(t=t, processes=procs, jobs=[{"job": "j", "state": "busy", "ranks": {}}],
                            changes=[{"t": t, "pid": 1000, "rank": 0, "job": "j", "state": "busy", "reason": f"tick {i}"}]))
        queued = [b for b in list(st.pending) if b.processes is not None]
        assert len(queued) <= 1, f"{len(queued)} lists of 300 processes queued"
        assert st.superseded >= 38
    finally:
        lock.rollback()
        lock.close()
    deadline = time.monotonic() + 60
    while st.pending and time.monotonic() < deadline:
        time.sleep(0.2)
    st.stop_writer()
    assert not st.pending
    with st.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM state_changes")).scalar() == 40
        assert c.execute(text("SELECT count(*), min(last_seen) FROM processes")).one() == (300, t0 + 39)
    st.close()


def test_writing_lists_of_any_length_prepares_one_statement_to_find_the_processes(tmp_path):
    """SQLite keeps every statement text it prepared (~25 KiB each, 128 per connection): the
    lookup of the processes' rows must not make a new text for every length of the list."""
    from sqlalchemy import event

    st = Store(f"sqlite:///{tmp_path / 's.db'}")
    texts: set[str] = set()

    @event.listens_for(st.engine, "before_cursor_execute")
    def _seen(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "FROM processes" in statement:
            texts.add(statement)

    t0 = time.time()
    for n in (1, 7, 99, 100, 101, 150, 250):
        st.submit(Batch(t=t0 + n, processes=[{"pid": 5000 + p, "job": "j", "state": "busy", "reason": "r"}
                                             for p in range(n)]))
    assert len(texts) == 1, texts
    with st.Session() as s:
        from sqlalchemy import func, select

        from hangd.store import models as m
        assert s.scalar(select(func.count()).select_from(m.Process)) == 250  # one row per pid, updated in place
        assert s.scalar(select(func.min(m.Process.last_seen))) == t0 + 250
    st.close()
