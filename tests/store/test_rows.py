"""The row mirror on a real SQLite database: one writer of the processes, jobs and gpus tables
that writes only what changed, marks what is no longer listed gone, and finds its rows again."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, select

from hangd.store import models as m
from hangd.store.db import make_engine, upgrade
from hangd.store.rows import (
    gpu_items,
    gpu_mirror,
    job_items,
    job_mirror,
    process_items,
    process_mirror,
)

NODE = 1
T = 1_700_000_000.0


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'rows.db'}"
    upgrade(url)
    eng = make_engine(url)
    with eng.begin() as c:
        c.execute(m.Node.__table__.insert().values(id=NODE, hostname="node-a", first_seen=T, last_seen=T))
    writes: list[tuple[str, int]] = []

    @event.listens_for(eng, "before_cursor_execute")
    def _seen(conn, cursor, statement, parameters, context, executemany):
        verb = statement.lstrip().split()[0].upper()
        if verb in ("INSERT", "UPDATE"):
            writes.append((verb, len(parameters) if executemany else 1))

    yield eng, writes
    eng.dispose()


def _write(eng, mirror, items, t, touch=False) -> None:
    from sqlalchemy.orm import Session

    with Session(eng) as s, s.begin():
        mirror.write(s, NODE, items, t, touch)


def _rows(eng, model) -> list[Any]:
    with eng.connect() as c:
        return list(c.execute(select(model.__table__).order_by(model.__table__.c.id)))


def _proc(pid: int, job: str = "j", state: str = "busy", reason: str = "r") -> dict[str, Any]:
    return {"pid": pid, "job": job, "rank": pid - 100, "state": state, "since": T, "reason": reason}


def test_only_what_changed_is_written_and_the_rest_touched_in_one_statement(db):
    eng, writes = db
    mirror = process_mirror()
    procs = [_proc(100), _proc(101), _proc(102)]
    _write(eng, mirror, process_items(procs, 2.0), T)
    assert writes == [("INSERT", 3)]
    writes.clear()
    _write(eng, mirror, process_items(procs, 2.0), T + 1)
    assert writes == []  # nothing changed, no touch due
    _write(eng, mirror, process_items([_proc(100), _proc(101, state="hung"), _proc(102)], 2.0), T + 2, touch=True)
    assert writes == [("UPDATE", 1), ("UPDATE", 2)]  # the changed one, then the others' last_seen at once
    rows = {r.pid: r for r in _rows(eng, m.Process)}
    assert len(rows) == 3 and rows[101].state == "hung"
    assert {r.last_seen for r in rows.values()} == {T + 2}
    assert {r.first_seen for r in rows.values()} == {T}


def test_what_is_no_longer_listed_is_marked_gone_and_comes_back_in_its_own_row(db):
    eng, _ = db
    mirror = process_mirror()
    _write(eng, mirror, process_items([_proc(100), _proc(101)], 2.0), T)
    _write(eng, mirror, process_items([_proc(100)], 2.0), T + 5)
    gone = {r.pid: r.gone_at for r in _rows(eng, m.Process)}
    assert gone == {100: None, 101: T + 5}
    assert set(mirror.rows) == {100}  # what it remembers follows the listing
    _write(eng, mirror, process_items([_proc(100), _proc(101)], 2.0), T + 6)
    rows = _rows(eng, m.Process)
    assert [(r.pid, r.gone_at, r.first_seen) for r in rows] == [(100, None, T), (101, None, T)]


def test_a_pid_seen_in_another_job_is_another_process(db):
    eng, _ = db
    mirror = process_mirror()
    _write(eng, mirror, process_items([_proc(100, job="a")], 2.0), T)
    _write(eng, mirror, process_items([_proc(100, job="b")], 2.0), T + 3)
    rows = _rows(eng, m.Process)
    assert [(r.job, r.first_seen, r.gone_at) for r in rows] == [("a", T, T + 3), ("b", T + 3, None)]


def test_a_new_mirror_finds_the_rows_and_writes_nothing_twice(db):
    eng, writes = db
    _write(eng, process_mirror(), process_items([_proc(100), _proc(101)], 2.0), T)
    _write(eng, job_mirror(), job_items([{"job": "j", "state": "busy", "ranks": {"0": 100}}]), T)
    writes.clear()
    # a restarted hangd (or one whose write was rolled back) remembers nothing: it reads them back
    _write(eng, process_mirror(), process_items([_proc(100), _proc(101)], 2.0), T + 1)
    _write(eng, job_mirror(), job_items([{"job": "j", "state": "busy", "ranks": {"0": 100}}]), T + 1)
    assert writes == []
    # a row marked gone that is listed again is the same row, written again
    mirror = process_mirror()
    _write(eng, mirror, process_items([_proc(100), _proc(101)], 2.0), T + 1)
    _write(eng, mirror, process_items([_proc(100)], 2.0), T + 2)
    assert [(r.pid, r.gone_at) for r in _rows(eng, m.Process)] == [(100, None), (101, T + 2)]
    writes.clear()
    _write(eng, process_mirror(), process_items([_proc(100), _proc(101)], 2.0), T + 3)
    assert writes == [("UPDATE", 1)]
    assert [(r.pid, r.gone_at) for r in _rows(eng, m.Process)] == [(100, None), (101, None)]


def test_a_row_deleted_from_under_it_is_written_again(db):
    eng, _ = db
    mirror = job_mirror()
    _write(eng, mirror, job_items([{"job": "j", "state": "busy"}]), T)
    with eng.begin() as c:  # retention, or another process, deleted it
        c.execute(m.Job.__table__.delete())
    _write(eng, mirror, job_items([{"job": "j", "state": "hung"}]), T + 1)
    assert [(r.key, r.state, r.first_seen) for r in _rows(eng, m.Job)] == [("j", "hung", T + 1)]


def test_words_are_redacted_in_the_table_and_compared_as_given(db):
    eng, writes = db
    mirror = process_mirror()
    secret = "waiting, HF_TOKEN=hf_abcdefgh12345"
    _write(eng, mirror, process_items([_proc(100, reason=secret)], 2.0), T)
    (row,) = _rows(eng, m.Process)
    assert "hf_abcdefgh12345" not in row.reason and row.reason.startswith("waiting, HF_TOKEN=")
    writes.clear()
    _write(eng, mirror, process_items([_proc(100, reason=secret)], 2.0), T + 1)
    assert writes == []


def test_gpus_are_not_marked_gone_and_change_in_place(db):
    eng, _ = db
    mirror = gpu_mirror()
    g0 = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "mem_total": 1 << 30}
    g1 = {"index": 1, "uuid": "GPU-1", "name": "NVIDIA H200", "mem_total": 1 << 30}
    _write(eng, mirror, gpu_items([g0, g1]), T)
    _write(eng, mirror, gpu_items([dict(g0, name="NVIDIA H200 NVL")]), T + 1)
    rows = _rows(eng, m.Gpu)
    assert [(r.index, r.name, r.last_seen) for r in rows] == [(0, "NVIDIA H200 NVL", T + 1), (1, "NVIDIA H200", T)]


def test_a_rank_s_progress_is_written_to_the_heartbeat_s_resolution(db):
    """Only a rank of a job that spans nodes (it carries ``waits``) writes its progress; it moves
    every tick, and is rounded down to the heartbeat so that its row changes once a heartbeat."""
    eng, writes = db
    mirror = process_mirror()
    rank = dict(_proc(100), waits=False, last_progress=T + 0.25, world_size=16)
    _write(eng, mirror, process_items([rank, dict(_proc(101), last_progress=T + 0.5)], 2.0), T)
    writes.clear()
    _write(eng, mirror, process_items([dict(rank, last_progress=T + 1.5), dict(_proc(101), last_progress=T + 9)], 2.0),
           T + 1)
    assert writes == []
    _write(eng, mirror, process_items([dict(rank, last_progress=T + 2.25), _proc(101)], 2.0), T + 2)
    rows = {r.pid: r for r in _rows(eng, m.Process)}
    assert rows[100].last_progress == T + 2.0 and rows[100].world_size == 16
    assert rows[101].last_progress is None and rows[101].world_size is None
