"""The store: incidents, the state timeline, processes, jobs, GPUs, and the fleet's rows.

SQLite by default (WAL, busy timeout); any SQLAlchemy URL works (PostgreSQL is tested). This
module runs the migrations and assembles ``Store`` from one part per job, each in its own module:

- ``engine``: the engine of a URL; ``lock``: one hangd writes one database (``StoreInUse``);
- ``writer``: the queue of batches, the thread that writes them, and the overlay that reads see
  of them meanwhile; a SQLite file removed or replaced under hangd is made again;
- ``rows``: the row mirror that writes only what changed of the processes, jobs and gpus tables;
- ``incidents``: incident writes (with the fleet join) and reads; ``history``: the state
  timeline and the GPUs' minutes; ``fleet``: the other nodes' ranks and jobs; ``frdumps``:
  flight-recorder rows; ``retention``: what is deleted when.

PostgreSQL is shared by a fleet: the lock is per node name, so every node's hangd writes the
same database, each its own rows (``node_id``). Each node numbers its incidents in a residue class
of its own (``id % ID_STRIDE == node_id % ID_STRIDE``), writes its ranks with a heartbeat (the
node's ``last_seen``, moved every ``heartbeat_s``), and reads the other nodes' ranks of the jobs
that span nodes (``remote_ranks``). An open incident of such a job holds ``open_key``, unique: the
first node to write it owns the row; another node that sees the same hang joins that row (its
own incident is an alias of it) and writes it only once the owner stopped reporting.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from hangd.exitcodes import CannotRun
from hangd.redact import redact_text
from hangd.snapshot import RemoteDump, RemoteRank
from hangd.store import schema
from hangd.store.base import (
    HEARTBEAT_S,
    ID_STRIDE,
    NODE_FORGET_S,
    NODE_STALE_S,
    TOUCH_EVERY_S,
    Batch,
)
from hangd.store.engine import PG_CONNECT_TIMEOUT_S, SQLITE_CACHE_KIB, make_engine, sqlite_path
from hangd.store.fleet import FleetReads
from hangd.store.frdumps import FlightRecorderRows
from hangd.store.history import History
from hangd.store.incidents import LIST_FIELDS, IncidentRows, incident_row_to_dict
from hangd.store.lock import PG_LOCK_KEY, InstanceLock, StoreInUse
from hangd.store.retention import Retention
from hangd.store.rows import PIDS_PER_QUERY, gpu_mirror, job_mirror, process_mirror
from hangd.store.writer import MAX_PENDING, WriterQueue

# what callers imported from here before the store was split: they still can
__all__ = ["HEARTBEAT_S", "ID_STRIDE", "LIST_FIELDS", "MAX_PENDING", "MIGRATIONS", "NODE_FORGET_S", "NODE_STALE_S",
           "PG_CONNECT_TIMEOUT_S", "PG_LOCK_KEY", "PIDS_PER_QUERY", "SQLITE_CACHE_KIB", "TOUCH_EVERY_S", "Batch",
           "MigrationError", "MigrationFailed", "Store", "StoreInUse", "downgrade", "incident_row_to_dict",
           "make_engine", "sqlite_path", "upgrade", "upgrade_apart"]

log = logging.getLogger("hangd.store")
MIGRATIONS = schema.migrations_dir()


class _StartError(Exception):
    pass


MIGRATION_LOCK = 0x68616E6764  # "hangd": the advisory lock key that serializes migrations on PostgreSQL


class MigrationError(Exception):
    """A migration that cannot run (unknown revision, ...): one line for the operator."""


def _alembic(url: str, action: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config
    from alembic.util.exc import CommandError

    eng = make_engine(url)
    cfg = Config()
    # the migrations ship inside the package (hangd.migrations), so an installed hangd has them too
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    try:
        with eng.begin() as conn:
            if conn.dialect.name == "postgresql":
                # every node of a fleet starts at once (a DaemonSet rollout) on one database: one migrates,
                # the others wait for it and then find nothing to do. Without this they create the same
                # tables at once, and all but one fail on PostgreSQL's catalog (pg_type) unique index.
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
            cfg.attributes["connection"] = conn
            # a newer hangd migrated past what this one knows: serve on it if declared runnable, or refuse
            if not (action == "upgrade" and revision == "head" and schema.serve_newer(conn, cfg, url)):
                getattr(command, action)(cfg, revision)
                schema.record(conn, cfg)
    except CommandError as e:
        raise MigrationError(f"{action} to {revision!r}: {str(e).splitlines()[0]}") from e
    finally:
        eng.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the Alembic migrations (``hangd db upgrade``; also done at every start)."""
    _alembic(url, "upgrade", revision)


def downgrade(url: str, revision: str = "base") -> None:
    _alembic(url, "downgrade", revision)


class MigrationFailed(SQLAlchemyError):
    """A migration run apart failed; the message starts with the child's exception type."""


MIGRATE_APART_TIMEOUT_S = 120


def upgrade_apart(url: str) -> None:
    """``upgrade(url)`` in a child interpreter. Importing Alembic (and Mako) costs ~14 MB that a
    long-lived daemon would keep for the rest of its life, for a step it takes once at start;
    unloading the modules gives none of it back. The URL goes on stdin, not on the command line,
    where anyone on the node could read its password. Raises MigrationError or MigrationFailed."""
    root = str(Path(__file__).resolve().parents[2])  # the child imports this same hangd
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    code = "import sys; from hangd.store.db import _upgrade_child; sys.exit(_upgrade_child())"
    try:
        r = subprocess.run([sys.executable, "-c", code], input=url, capture_output=True, text=True, env=env,
                           timeout=MIGRATE_APART_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise MigrationFailed(f"(TimeoutExpired) the migration did not finish in {MIGRATE_APART_TIMEOUT_S} s") from e
    if r.returncode == 0:
        for line in r.stderr.strip().splitlines()[-5:]:  # what it warned of: a schema newer than this hangd
            log.warning("%s", redact_text(line))
        return
    try:
        err = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        raise MigrationFailed(f"(migration) {redact_text(tail)[:300]}") from None
    if err["error"] == "migration":
        raise MigrationError(err["message"])
    if err["error"] == "cannot_run":
        raise CannotRun(err["message"])
    raise MigrationFailed(f"({err['type']}) {err['message']}")


def _upgrade_child() -> int:
    url = sys.stdin.read()
    try:
        upgrade(url)
    except MigrationError as e:
        print(json.dumps({"error": "migration", "message": str(e)}))
        return 1
    except CannotRun as e:  # a schema newer than this hangd can run on, a driver not installed
        print(json.dumps({"error": "cannot_run", "message": str(e)}))
        return 1
    except (SQLAlchemyError, OSError) as e:
        print(json.dumps({"error": "database", "type": type(e).__name__, "message": str(e)}))
        return 1
    return 0


class Store(WriterQueue, IncidentRows, History, FleetReads, FlightRecorderRows, Retention):
    """One database as hangd writes and reads it: the parts (one per module) share what is set here."""

    def __init__(self, url: str, hostname: str | None = None, migrate: bool = True, exclusive: bool = False,
                 migrate_apart: bool = False, heartbeat_s: float = HEARTBEAT_S, node_stale_s: float = NODE_STALE_S,
                 register: bool = True) -> None:
        """``exclusive``: take the database's one-writer lock (``hangd serve``), or raise StoreInUse.
        ``migrate_apart``: run the migrations in a child interpreter (``upgrade_apart``; the daemon).
        ``heartbeat_s``, ``node_stale_s``: for a shared (PostgreSQL) database, how often this node
        says it is alive, and how old another node's last word may be before it counts as stopped.
        ``register``: False for a reader (``hangd status --job``) that is no node of the fleet."""
        schema.require_driver(url)  # before the lock and the migrations, which need it too
        self.url = url
        self.shared = url.startswith("postgresql")
        # a node's own row moves with the heartbeat; the rows of its processes, jobs and GPUs only
        # every TOUCH_EVERY_S (what went away is marked gone_at at once; see _current)
        self.touch_every_s = TOUCH_EVERY_S
        self.heartbeat_s = heartbeat_s
        self.node_stale_s = node_stale_s
        # this node's incident id -> the id of the row it joined (another node opened it first)
        self._alias: dict[int, int] = {}
        self._joined: set[int] = set()
        self._remote_jobs: set[str] = set()
        self._remote: tuple[float, list[RemoteRank]] | None = None
        self._remote_dumps: tuple[float, list[RemoteDump]] | None = None
        # fr_ranks row id -> (read_at, Dump): a dump is read again only once its node replaced it
        self._dump_cache: dict[int, tuple[float, Any]] = {}
        self._newest_fr: dict[tuple[str, int], Batch] = {}
        self.remote_read_failures = 0
        self._remote_read: tuple[float, list[str]] = (0.0, [])  # when (monotonic) and of which jobs last read
        self._upgrade = upgrade_apart if migrate_apart else upgrade
        self.lock: InstanceLock | None = InstanceLock(url, hostname or socket.gethostname()) if exclusive else None
        self._migrated = not migrate
        self._start_error: str | None = None
        try:
            if migrate:
                self._upgrade(url)
                self._migrated = True
        except SQLAlchemyError as e:  # a full disk or a locked file at start: serve anyway, migrate later
            self._start_error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        except BaseException:
            self.close()
            raise
        self.path = sqlite_path(url)
        self.engine = make_engine(url)
        self.Session = sessionmaker(self.engine, expire_on_commit=False)
        self.hostname = hostname or socket.gethostname()
        self.pending: deque[Batch] = deque()
        self.dropped = 0
        # the newest queued batch that carries the processes (and the jobs): a newer one replaces
        # its lists, so a store slower than the ticks holds one copy of them, not one per tick
        self._newest_procs: Batch | None = None
        self._newest_jobs: Batch | None = None
        self.superseded = 0
        self.healthy = True
        self.last_error: str | None = None
        self.write_failures_total = 0
        self._lock = threading.Lock()
        self._last_log = 0.0
        self._gpu_acc = {}
        self.node_id: int = 0
        # what the processes, jobs and gpus rows of this node hold (the writer thread's, under _lock)
        self._mirrors = {"processes": process_mirror(), "jobs": job_mirror(), "gpus": gpu_mirror()}
        # per kind of row (nodes, processes, jobs, gpus): when its unchanged rows' last_seen last
        # moved. Apart: a batch may carry no list of a kind (superseded in the queue, or not due),
        # and a touch it was due must then fall on the next batch that carries one
        self._touched_at: dict[str, float] = dict.fromkeys(("nodes", "processes", "jobs", "gpus"), 0.0)
        self._beat_at = 0.0
        self._rows_stale = False
        # queued but not yet written: incident id -> (seq of its newest batch, its dict); acks likewise
        self._overlay_lock = threading.Lock()
        self._unwritten: dict[int, tuple[int, dict[str, Any]]] = {}
        self._acks: dict[int, float] = {}
        self._seq = 0
        # the database file as opened: (st_dev, st_ino); a file removed or replaced under hangd is noticed
        self._ident = self._file_ident()
        self._last_file_check = time.monotonic()
        self._last_lock_check = time.monotonic()
        self.recreated = 0
        self._writer: threading.Thread | None = None
        self._wake = threading.Event()
        self._writer_stop = threading.Event()
        self.needs_rewrite = False  # the database was recreated: the daemon writes its open incidents again
        try:
            if self._start_error is not None:
                raise _StartError(self._start_error)
            if register:
                self.node_id = self._node()
        except (SQLAlchemyError, _StartError) as e:  # a full disk or a locked file at start: serve anyway, write later
            self.healthy = False
            self.last_error = self._start_error or f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            log.error("store not writable at start (will retry): %s", self.last_error)

    def close(self) -> None:
        """Release the database lock (and the connections)."""
        self.stop_writer()
        if getattr(self, "engine", None) is not None:
            self.engine.dispose()
        if self.lock is not None:
            self.lock.close()
            self.lock = None
