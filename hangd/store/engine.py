"""The database engine: SQLite in WAL with a busy timeout and a bounded page cache; any other
SQLAlchemy URL (PostgreSQL is tested) with a connect timeout, so that a database that does not
answer never hangs start-up or a tick."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event

from hangd.store import schema

PG_CONNECT_TIMEOUT_S = 10
# SQLite keeps the pages a connection has touched, up to cache_size, for as long as the connection
# lives: a daemon's RSS creeps up while its database grows, until every pooled connection holds
# this much. Set (to SQLite's own default) so that the bound is written down: 2000 KiB per
# connection; the pool keeps at most 5 (the soak's daemon uses 2).
SQLITE_CACHE_KIB = 2000


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL; None for other databases and in-memory SQLite."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):].split("?", 1)[0]
    return None if not path or path == ":memory:" else os.path.expanduser(path)


def make_engine(url: str) -> Engine:
    schema.require_driver(url)  # a driver not installed: one line saying what to install
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        path = url[len("sqlite:///"):]
        if path:
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    # a database that does not answer must not hang start-up or a tick: give up after a while
    connect_args = {"connect_timeout": PG_CONNECT_TIMEOUT_S} if url.startswith("postgresql") else {}
    eng = create_engine(url, pool_pre_ping=True, future=True, connect_args=connect_args)
    if eng.dialect.name == "sqlite":
        @event.listens_for(eng, "connect")
        def _sqlite_pragmas(conn: Any, _rec: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=2000")
            cur.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")
            cur.close()
    return eng
