"""Whom to page, in the store: the ``who`` of incidents and jobs (migration 0007) on real SQLite
and a real PostgreSQL. Rows written without it read as unknown; the migration goes both ways and
keeps the rows."""

from __future__ import annotations

import json

from sqlalchemy import create_engine, inspect, text

from hangd.store.db import Batch, Store, downgrade, upgrade

WHO = {"user": "alice", "uid": 1001, "slurm": {"job_id": "1234", "name": "run password=hunter2", "account": "ml"},
       "pod": {"uid": "6b9f1f8e-3c5a-4b8e-9d1a-2f7e8c9a0b1c", "name": "train-0", "namespace": "ml"},
       "text": "owner alice, Slurm job 1234 (run password=hunter2, account ml), pod ml/train-0"}


def _incident(iid: int, t: float, **kw: object) -> dict:
    return {"id": iid, "kind": "host_stall", "severity": "critical", "job": "slurm:1234", "opened_at": t,
            "updated_at": t, "resolved_at": None, "summary": "s", "next_step": "", "pids": [1], "ranks": [0],
            "culprit_pids": [1], "culprit_ranks": [0], "evidence": {}, "findings": [], "timeline": [], **kw}


def _columns(url: str, table: str) -> set[str]:
    return {c["name"] for c in inspect(create_engine(url)).get_columns(table)}


def _job_who(url: str) -> object:
    with create_engine(url).connect() as c:
        v = c.execute(text("SELECT who FROM jobs WHERE key = 'slurm:1234'")).scalar_one()
    return json.loads(v) if isinstance(v, str) else v


def _round_trip(url: str) -> None:
    st = Store(url, hostname="node-a")
    t = 1_000_000.0
    st.submit(Batch(t=t, incidents=[_incident(1, t, who=WHO), _incident(2, t)],
                    jobs=[{"job": "slurm:1234", "name": "1234", "state": "hung", "ranks": {"0": 1}, "who": WHO}]))
    got = st.get_incident(1)
    assert got is not None and got["who"]["user"] == "alice" and got["who"]["pod"]["name"] == "train-0"
    assert "hunter2" not in json.dumps(got["who"]), "what is stored is redacted again"
    assert st.get_incident(2)["who"] is None  # written by a hangd that did not know: unknown
    assert [i["who"] is not None for i in sorted(st.list_incidents()[1], key=lambda i: i["id"])] == [True, False]
    assert _job_who(url)["slurm"]["job_id"] == "1234"
    st.close()
    downgrade(url, "0005")
    assert "who" not in _columns(url, "incidents") and "who" not in _columns(url, "jobs")
    upgrade(url)
    st = Store(url, hostname="node-a")
    assert st.get_incident(1)["who"] is None and st.get_incident(1)["summary"] == "s"  # the row outlived it
    st.close()


def test_who_in_sqlite(tmp_path):
    _round_trip(f"sqlite:///{tmp_path / 'w.db'}")


def test_who_in_postgres(fresh_pg):
    _round_trip(fresh_pg)
