"""One hangd writes one database: ``hangd serve`` takes an exclusive lock (a ``flock`` on
``<db>.lock`` for SQLite, a session advisory lock per node name for PostgreSQL) and a second one
refuses to start instead of overwriting the first one's incidents (both number incidents from
the same max)."""

from __future__ import annotations

import fcntl
import logging
import os
import time
import zlib
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from hangd.store.engine import PG_CONNECT_TIMEOUT_S, sqlite_path

log = logging.getLogger("hangd.store")
# pg_try_advisory_lock keys: "hgd" as an integer, then the node name's CRC: one hangd per node name
PG_LOCK_KEY = int.from_bytes(b"hgd", "big")


class StoreInUse(Exception):
    """Another hangd already writes this database: says which one."""


class InstanceLock:
    """The one-writer lock of a database, held for the life of the process."""

    def __init__(self, url: str, hostname: str) -> None:
        self.url = url
        self.fd: int | None = None
        self.conn: Any = None
        self.engine: Engine | None = None
        who = f"pid {os.getpid()} on {hostname}"
        path = sqlite_path(url)
        if path is not None:
            lock_path = path + ".lock"
            Path(lock_path).parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as e:  # a full or read-only disk: the store will say so; serve anyway
                log.warning("cannot create the lock file %s (%s): not guarding against a second hangd", lock_path,
                            e.strerror)
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise StoreInUse(f"db {path}: already in use by another hangd ({holder}); stop it, or give this one "
                                 "its own --db") from None
            self.fd = fd
            try:  # who holds it, for the error the next one prints; best effort on a full disk
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{who}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
            except OSError:
                pass
        elif url.startswith("postgresql"):
            self.engine = create_engine(url, poolclass=NullPool,
                                        connect_args={"application_name": f"hangd {who}"[:63],
                                                      "connect_timeout": PG_CONNECT_TIMEOUT_S})
            self.conn = self.engine.connect()
            node_key = zlib.crc32(hostname.encode()) - (1 << 31)  # int4, as the two-key form takes
            got = self.conn.execute(text("SELECT pg_try_advisory_lock(:k, :n)"), {"k": PG_LOCK_KEY, "n": node_key}).scalar()
            self.conn.commit()
            if not got:
                holder = self.conn.execute(text(
                    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE :who LIMIT 1"),
                    {"who": f"hangd pid % on {hostname}"[:63] + "%"}).scalar()
                self.close()
                db = url.rsplit("/", 1)[-1].split("?", 1)[0]
                raise StoreInUse(f"db {db}: already in use by another hangd for node {hostname} ({holder or 'unknown'}); "
                                 "stop it, or give this one another --node-name")

    def alive(self) -> bool:
        """For PostgreSQL: whether the session that holds the lock is still there."""
        if self.conn is None:
            return True
        try:
            self.conn.execute(text("SELECT 1")).scalar()
            self.conn.commit()
            return True
        except SQLAlchemyError:
            return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.conn is not None:
            try:
                self.conn.close()
            except SQLAlchemyError:
                pass
            self.conn = None
        if self.engine is not None:
            self.engine.dispose()
            self.engine = None
