"""The store on real SQLite and a real PostgreSQL: migrations both ways, retention, a live serve."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from hangd.store.db import (
    TOUCH_EVERY_S,
    Batch,
    MigrationFailed,
    Store,
    downgrade,
    upgrade,
    upgrade_apart,
)

from ..conftest import ROOT, TRACES
from ..served import serve

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


def _rows(st: Store, table: str, order: str) -> list[dict]:
    with st.engine.connect() as c:
        return [dict(r._mapping) for r in c.execute(text(f"SELECT * FROM {table} WHERE node_id = :n ORDER BY {order}"),
                                                     {"n": st.node_id})]


def _statements(st: Store) -> list[str]:
    seen: list[str] = []
    event.listen(st.engine, "before_cursor_execute", lambda _c, _cur, stmt, *_: seen.append(stmt.split()[0].upper()))
    return seen


def _procs(states: dict[int, str], job: str = "j") -> list[dict]:
    return [{"pid": pid, "job": job, "rank": pid - 100, "state": st, "since": 1.0,
             "reason": f"rank {pid - 100} {st}; HF_TOKEN=hf_abcdefghijklmnop"} for pid, st in states.items()]


GPU = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "mem_total": 150754820096, "util_gpu": 50, "gpm": None,
       "mem_used": 1e9, "power_w": 300.0}


def _rows_written_only_when_they_change(url: str, hostname: str) -> None:
    # a fleet node (PostgreSQL) moves its own row with its heartbeat: at 10 s it writes as a lone node does
    st = Store(url, hostname=hostname, heartbeat_s=TOUCH_EVERY_S)
    t = 1_000_000.0
    jobs = [{"job": "j", "name": "train", "state": "busy", "ranks": {"0": 100, "1": 101}}]
    st.submit(Batch(t=t, processes=_procs({100: "busy", 101: "busy", 102: "busy"}), jobs=jobs, gpus=[GPU]))
    procs = _rows(st, "processes", "pid")
    assert [(p["pid"], p["state"], p["last_seen"]) for p in procs] == [(100, "busy", t), (101, "busy", t), (102, "busy", t)]
    assert "hf_abcdefghijklmnop" not in procs[0]["reason"], "a stored reason is redacted"
    assert [(j["key"], j["state"], j["ranks"] if isinstance(j["ranks"], dict) else json.loads(j["ranks"]))
            for j in _rows(st, "jobs", "key")] == [("j", "busy", {"0": 100, "1": 101})]
    assert [(g["index"], g["uuid"]) for g in _rows(st, "gpus", "id")] == [(0, "GPU-0")]

    # a tick where nothing moved writes nothing at all (no statement reaches the database)
    seen = _statements(st)
    st.submit(Batch(t=t + 1, processes=_procs({100: "busy", 101: "busy", 102: "busy"}), jobs=jobs, gpus=[GPU]))
    assert seen == [], f"an unchanged tick wrote {seen}"
    # one process moved: its row alone changes, in one statement
    st.submit(Batch(t=t + 2, processes=_procs({100: "busy", 101: "hung", 102: "busy"}), jobs=jobs, gpus=[GPU]))
    assert seen == ["UPDATE"], seen
    procs = _rows(st, "processes", "pid")
    assert [(p["state"], p["last_seen"]) for p in procs] == [("busy", t), ("hung", t + 2), ("busy", t)]
    # ten seconds on, the rows that did not change are seen again; a pid in another job is a new row
    seen.clear()
    st.submit(Batch(t=t + 11, processes=_procs({100: "busy", 101: "hung"}) + _procs({102: "idle"}, job="k"),
                    jobs=jobs, gpus=[GPU]))
    # a new row, the row it replaces marked gone, the moved rows of processes, jobs, GPUs and the
    # node's: one statement each
    assert sorted(seen) == ["INSERT", "UPDATE", "UPDATE", "UPDATE", "UPDATE", "UPDATE"], seen
    procs = _rows(st, "processes", "pid, first_seen")
    assert [(p["pid"], p["job"], p["state"], p["first_seen"], p["last_seen"], p["gone_at"]) for p in procs] == [
        (100, "j", "busy", t, t + 11, None), (101, "j", "hung", t, t + 11, None), (102, "j", "busy", t, t + 11, t + 11),
        (102, "k", "idle", t + 11, t + 11, None)]
    assert [g["last_seen"] for g in _rows(st, "gpus", "id")] == [t + 11]
    st.close()

    # a restarted hangd carries on with the same rows instead of adding new ones
    st = Store(url, hostname=hostname, heartbeat_s=TOUCH_EVERY_S)
    st.submit(Batch(t=t + 12, processes=_procs({100: "idle", 101: "hung"}) + _procs({102: "idle"}, job="k"),
                    jobs=[dict(jobs[0], state="idle")], gpus=[GPU]))
    procs = _rows(st, "processes", "pid, first_seen")
    assert [(p["pid"], p["job"], p["state"], p["first_seen"]) for p in procs] == [
        (100, "j", "idle", t), (101, "j", "hung", t), (102, "j", "busy", t), (102, "k", "idle", t + 11)]
    assert [(j["key"], j["state"], j["first_seen"]) for j in _rows(st, "jobs", "key")] == [("j", "idle", t)]
    assert len(_rows(st, "gpus", "id")) == 1

    # rows deleted from under it (retention) are written again, not lost
    with st.engine.begin() as c:
        c.execute(text("DELETE FROM processes WHERE node_id = :n"), {"n": st.node_id})
    st.submit(Batch(t=t + 13, processes=_procs({100: "busy", 101: "hung"}), jobs=jobs, gpus=[GPU]))
    assert [(p["pid"], p["state"]) for p in _rows(st, "processes", "pid")] == [(100, "busy"), (101, "hung")]
    st.close()


def test_store_writes_rows_only_when_they_change_sqlite(tmp_path):
    _rows_written_only_when_they_change(f"sqlite:///{tmp_path / 'w.db'}", "node-a")


def test_store_writes_rows_only_when_they_change_postgres(postgres_url):
    _rows_written_only_when_they_change(postgres_url, f"node-rows-{time.time_ns()}")


def test_the_daemon_migrates_in_a_child_and_keeps_alembic_out_of_its_memory(tmp_path):
    url = f"sqlite:///{tmp_path / 'apart.db'}"
    code = ("import sys; from hangd.store.db import Store; st = Store(sys.argv[1], migrate_apart=True); "
            "print(st.healthy, 'alembic' in sys.modules, 'mako' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.stdout.split() == ["True", "False", "False"], r.stdout + r.stderr
    assert _tables(url) >= TABLES


def test_a_migration_in_a_child_fails_as_it_would_in_process(tmp_path):
    with pytest.raises(MigrationFailed, match=r"^\(OperationalError\)") as e:
        upgrade_apart("postgresql+psycopg://u:s3cr3tpw@127.0.0.1:1/hangd")
    assert isinstance(e.value, SQLAlchemyError) and "s3cr3tpw" not in str(e.value)
    (tmp_path / "bad.db").write_text("not a database, but long enough to be read as one " * 100)
    with pytest.raises(SQLAlchemyError, match="file is not a database"):
        upgrade_apart(f"sqlite:///{tmp_path / 'bad.db'}")


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
    # a writer that keeps up supersedes nothing: each list is written before the next comes
    before = st.superseded
    for i in range(5):
        st.submit(Batch(t=t0 + 40 + i, processes=[{"pid": 1000, "job": "j", "rank": 0, "state": "busy", "since": t0,
                                                   "reason": "r"}], jobs=[]))
    assert st.superseded == before
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


def test_what_the_writer_remembers_of_rows_is_bounded_by_what_is_listed_now(tmp_path):
    """The writer remembers the rows it wrote so that it writes only what changed; under job churn
    (a new job every few seconds for weeks) that memory must follow the listing, not the history,
    while the table keeps the history."""
    st = Store(f"sqlite:///{tmp_path / 'churn.db'}")
    t0 = time.time()
    for i in range(60):  # 60 two-rank jobs, each listed for three ticks
        procs = [{"pid": 10_000 + 2 * k + r, "job": f"j{k}", "rank": r, "state": "busy", "reason": "r"}
                 for k in range(max(0, i - 2), i + 1) for r in range(2)]
        st.submit(Batch(t=t0 + i, processes=procs, jobs=[{"job": f"j{k}", "state": "busy", "ranks": {}}
                                                         for k in range(max(0, i - 2), i + 1)]))
    procs, jobs = st._mirrors["processes"].rows, st._mirrors["jobs"].rows
    assert len(procs) <= 6 and len(jobs) <= 3, (len(procs), len(jobs))
    with st.Session() as s:
        from sqlalchemy import func, select

        from hangd.store import models as m
        assert s.scalar(select(func.count()).select_from(m.Process)) == 120
        assert s.scalar(select(func.count()).select_from(m.Job)) == 60
    # a process listed again after a while is found, not written twice
    st.submit(Batch(t=t0 + 100, processes=[{"pid": 10_000, "job": "j0", "rank": 0, "state": "idle", "reason": "r"}]))
    with st.Session() as s:
        assert s.scalar(select(func.count()).select_from(m.Process)) == 120
        assert s.scalar(select(m.Process.state).where(m.Process.pid == 10_000)) == "idle"
    st.close()
