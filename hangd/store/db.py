"""The store: incidents, the state timeline, processes, jobs, GPUs and downsampled GPU history.

SQLite by default (WAL, busy timeout); any SQLAlchemy URL works (PostgreSQL is tested). Writes
come from the loop thread in batches; a batch that fails (database locked, disk full, read-only)
stays queued, bounded, and is retried on the next tick, so hangd keeps diagnosing and serving
and catches up when the database comes back. While batches are queued, reads overlay the queued
incidents (and acknowledgements) on the database's rows, so every endpoint tells the same story.

One hangd writes one database: ``hangd serve`` takes an exclusive lock (a ``flock`` on
``<db>.lock`` for SQLite, a session advisory lock for PostgreSQL) and a second one refuses to
start instead of overwriting the first one's incidents (both number incidents from the same max).

PostgreSQL is shared by a fleet: the lock is per node name, so every node's hangd writes the
same database, each its own rows (``node_id``). Each node numbers its incidents in a residue class
of its own (``id % ID_STRIDE == node_id % ID_STRIDE``), writes its ranks with a heartbeat (the
node's ``last_seen``, moved every ``heartbeat_s``), and reads the other nodes' ranks of the jobs
that span nodes (``remote_ranks``). An open incident of such a job holds ``open_key``, unique: the
first node to write it owns the row; another node that sees the same hang joins that row (its
own incident is an alias of it) and writes it only once the owner stopped reporting.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    CursorResult,
    Engine,
    Table,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, defer, sessionmaker
from sqlalchemy.pool import NullPool

from hangd.analysis.signals import Thresholds
from hangd.exitcodes import CannotRun
from hangd.flightrec import rows as frrows
from hangd.incidents import FAMILY
from hangd.redact import redact_obj, redact_text
from hangd.snapshot import RemoteDump, RemoteRank
from hangd.store import models as m
from hangd.store import schema

log = logging.getLogger("hangd.store")
MIGRATIONS = schema.migrations_dir()
MAX_PENDING = 20_000
FILE_CHECK_EVERY_S = 2.0
LOCK_CHECK_EVERY_S = 10.0
TOUCH_EVERY_S = 10.0  # how stale the last_seen of an unchanged process, job or GPU row may get
# pg_try_advisory_lock keys: "hgd" as an integer, then the node name's CRC: one hangd per node name
PG_LOCK_KEY = int.from_bytes(b"hgd", "big")
ID_STRIDE = 1024  # incident ids of a shared database: node_id % ID_STRIDE, then every ID_STRIDE
HEARTBEAT_S = 2.0  # a shared database: how often a node's last_seen moves (its one row)
NODE_STALE_S = Thresholds.node_stale_s  # a shared database: a node whose last_seen is older has stopped reporting
NODE_FORGET_S = 3600.0  # a node silent longer than this is not listed with a job any more
LIST_FIELDS = ("evidence", "findings", "timeline")
# the tables written with Core statements (many rows in one executemany, no ORM objects)
PROCESSES = cast(Table, m.Process.__table__)
JOBS = cast(Table, m.Job.__table__)
GPUS = cast(Table, m.Gpu.__table__)
NODES = cast(Table, m.Node.__table__)
STATE_CHANGES = cast(Table, m.StateChange.__table__)
FR_RANKS = cast(Table, m.FrRank.__table__)
FR_ENTRIES = cast(Table, m.FrEntry.__table__)


class _StartError(Exception):
    pass


class StoreInUse(Exception):
    """Another hangd already writes this database: says which one."""


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL; None for other databases and in-memory SQLite."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):].split("?", 1)[0]
    return None if not path or path == ":memory:" else os.path.expanduser(path)


PG_CONNECT_TIMEOUT_S = 10
# SQLite keeps the pages a connection has touched, up to cache_size, for as long as the connection
# lives: a daemon's RSS creeps up while its database grows, until every pooled connection holds
# this much. Set (to SQLite's own default) so that the bound is written down: 2000 KiB per
# connection; the pool keeps at most 5 (the soak's daemon uses 2).
SQLITE_CACHE_KIB = 2000
PIDS_PER_QUERY = 100


def _padded(keys: list[Any]) -> list[list[Any]]:
    """``keys`` in parts of PIDS_PER_QUERY, the last one filled up by repeating its last key."""
    parts = [keys[i:i + PIDS_PER_QUERY] for i in range(0, len(keys), PIDS_PER_QUERY)]
    if parts:
        parts[-1] += parts[-1][-1:] * (PIDS_PER_QUERY - len(parts[-1]))
    return parts


_GONE = object()  # what the store remembers of a row marked gone: equal to no values


def _keep_only(rows: dict[Any, Any], listed: set[Any]) -> None:
    """What the store remembers of rows it wrote, for the things listed now only: under job churn
    a node lists thousands of processes an hour (one that comes back is looked up again)."""
    for key in [k for k in rows if k not in listed]:
        del rows[key]


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


def incident_row_to_dict(r: m.Incident, with_evidence: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": r.id, "kind": r.kind, "severity": r.severity, "job": r.job, "status": r.status,
        "opened_at": r.opened_at, "updated_at": r.updated_at, "resolved_at": r.resolved_at,
        "hang_started_at": r.hang_started_at, "acked": r.acked, "summary": r.summary, "next_step": r.next_step,
        "pids": r.pids, "ranks": r.ranks, "culprit_pids": r.culprit_pids, "culprit_ranks": r.culprit_ranks,
        "who": r.who,
    }
    if with_evidence:
        d.update({"evidence": r.evidence, "findings": r.findings, "timeline": r.timeline})
    return d


@dataclass
class Batch:
    t: float
    incidents: list[dict[str, Any]] = field(default_factory=list)
    changes: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] | None = None
    jobs: list[dict[str, Any]] | None = None
    gpus: list[dict[str, Any]] | None = None
    seq: int = 0  # set when queued
    spanning: set[str] = field(default_factory=set)  # the jobs (keys) with ranks on other nodes
    # flight-recorder dumps read this tick of ranks of jobs that span nodes: (job, rank) -> (read
    # at, flightrec Dump); written to a shared store only, a newer queued dump of a rank replaces it
    fr: dict[tuple[str, int], tuple[float, Any]] = field(default_factory=dict)


class _Lock:
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


class Store:
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
        self.lock: _Lock | None = _Lock(url, hostname or socket.gethostname()) if exclusive else None
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
        self._gpu_acc: dict[tuple[int, int], list[tuple[float | None, float | None, float | None, float | None]]] = {}
        self.node_id: int = 0
        # what the processes, jobs and gpus rows of this node hold (the writer thread's, under _lock)
        self._proc_rows: dict[int, tuple[float, tuple[Any, ...]]] = {}  # pid -> (first_seen, values)
        self._job_rows: dict[str, tuple[Any, ...]] = {}
        self._gpu_rows: dict[int, tuple[Any, ...]] = {}
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

    # ------------------------------------------------------------------ the file under us

    def _file_ident(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def check_file(self, force: bool = False) -> None:
        """Notice a SQLite file removed or replaced while hangd runs (``rm hangd.db``: the open
        connections would go on writing into the unlinked inode and every write would be lost),
        then start a new file; the daemon rewrites the open incidents into it. Never raises."""
        if self.path is None or (not force and time.monotonic() - self._last_file_check < FILE_CHECK_EVERY_S):
            return
        self._last_file_check = time.monotonic()
        if self._file_ident() == self._ident and self._ident is not None:
            return
        with self._lock:
            gone = not os.path.exists(self.path)
            why = "removed" if gone else "replaced by another file"
            try:
                self.engine.dispose()  # drop the connections to the old inode
                if gone:  # a WAL left from the old file must not be replayed into the new one
                    for suffix in ("-wal", "-shm"):
                        if os.path.exists(self.path + suffix):
                            os.unlink(self.path + suffix)
                self._forget_rows()
                self._upgrade(self.url)
                self._ident = self._file_ident()
                self.node_id = self._node()
            except (SQLAlchemyError, OSError) as e:
                self.healthy = False
                self.write_failures_total += 1
                self.last_error = f"database file {self.path} was {why} and cannot be recreated: " \
                                  f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                if time.time() - self._last_log > 60:
                    self._last_log = time.time()
                    log.error("%s", self.last_error)
                return
            self.recreated += 1
            self.needs_rewrite = True
            log.error("database file %s was %s while hangd ran; created a new one (the history before now is not "
                      "in it) and writing the open incidents into it again", self.path, why)

    def _node(self) -> int:
        now = time.time()
        with self.Session.begin() as s:
            n = s.scalar(select(m.Node).where(m.Node.hostname == self.hostname))
            if n is None:
                n = m.Node(hostname=self.hostname, first_seen=now, last_seen=now)
                s.add(n)
                s.flush()
            return int(n.id)

    # ------------------------------------------------------------------ writing

    def submit(self, batch: Batch) -> None:
        """Queue a batch. With the writer thread running it is written there, so a locked or slow
        database never stalls the sampling loop; without it, it is written now. Never raises."""
        with self._overlay_lock:
            self._seq += 1
            batch.seq = self._seq
            for d in batch.incidents:
                self._unwritten[d["id"]] = (batch.seq, d)
            # The processes and jobs of a batch are the whole current list, each row stamped with
            # the batch's time: a newer list still queued says all an older one would, so the older
            # one is not written. Incidents and state changes are events and are all kept.
            if batch.processes is not None:
                old, self._newest_procs = self._newest_procs, batch
                if old is not None and old.processes is not None:
                    old.processes = None
                    self.superseded += 1
            if batch.jobs is not None:
                old, self._newest_jobs = self._newest_jobs, batch
                if old is not None:
                    old.jobs = None
            # a rank's newer dump says all its older one still queued would (a dump is big)
            for key in batch.fr:
                older = self._newest_fr.get(key)
                if older is not None and older is not batch:
                    older.fr.pop(key, None)
                self._newest_fr[key] = batch
        self.pending.append(batch)
        if self._writer is not None:
            self._wake.set()
            return
        self.check_file()
        with self._lock:
            self._flush()

    def start_writer(self) -> None:
        """Write queued batches from a thread of the store's own (``hangd serve``)."""
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="hangd-store", daemon=True)
            self._writer.start()

    def stop_writer(self, timeout: float = 10.0) -> None:
        if getattr(self, "_writer", None) is not None:
            assert self._writer is not None
            self._writer_stop.set()
            self._wake.set()
            self._writer.join(timeout)
            self._writer = None

    def _write_loop(self) -> None:
        while not self._writer_stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            self.maintain()
            if self.pending and not self.healthy:
                self._writer_stop.wait(1.0)  # the database refuses: retry once a second, not in a spin

    def maintain(self) -> None:
        """The file check, the lock, and the queued writes; called by the writer (or the loop)."""
        self.check_file()
        if self.lock is not None and time.monotonic() - self._last_lock_check >= LOCK_CHECK_EVERY_S:
            self._last_lock_check = time.monotonic()
            if not self.lock.alive():  # PostgreSQL restarted or the connection dropped: the lock went with it
                log.error("lost the connection that holds the database lock; another hangd could now take the "
                          "database (restart hangd to hold it again)")
        if self.pending or self._acks:
            with self._lock:
                self._flush()
        self._read_remote()

    # The other nodes' ranks are read here, by the writer thread, after its writes: a database that
    # is slow or gone must never stall the sampling loop, which only takes what was last read.

    def want_remote(self, jobs: set[str]) -> None:
        """The jobs (keys) whose ranks on other nodes the loop wants from now on."""
        with self._overlay_lock:
            self._remote_jobs = set(jobs)

    def cached_remote(self) -> tuple[float, list[RemoteRank]] | None:
        """The other nodes' ranks as last read: (when, ranks), or None when never read."""
        with self._overlay_lock:
            return self._remote

    def cached_remote_dumps(self) -> tuple[float, list[RemoteDump]] | None:
        """The flight-recorder dumps other nodes wrote of those jobs' ranks, as last read: (when,
        dumps), or None when never read."""
        with self._overlay_lock:
            return self._remote_dumps

    def _read_remote(self) -> None:
        with self._overlay_lock:
            jobs = sorted(self._remote_jobs)
        if not jobs or not self.shared or not self.healthy:
            return
        # what it reads moves once a heartbeat of the other nodes (their node row, their ranks'
        # progress at that resolution): read as often, not on every write, unless the jobs changed
        # (three quarters of it: writes a heartbeat apart, give or take, each read)
        now = time.monotonic()
        if jobs == self._remote_read[1] and 0 <= now - self._remote_read[0] < 0.75 * self.heartbeat_s:
            return
        self._remote_read = (now, jobs)
        try:
            ranks = self.remote_ranks(jobs, time.time())
            dumps = self.remote_dumps(jobs, time.time())
        except (SQLAlchemyError, OSError) as e:
            self.remote_read_failures += 1
            if time.time() - self._last_log > 60:
                self._last_log = time.time()
                log.warning("could not read the other nodes' ranks: %s", str(e).splitlines()[0][:200])
            return
        with self._overlay_lock:
            self._remote = (time.time(), ranks)
            self._remote_dumps = (time.time(), dumps)

    def _forget(self, b: Batch) -> None:
        """Drop a written (or dropped) batch's incidents from the overlay, unless a newer batch has them."""
        with self._overlay_lock:
            for d in b.incidents:
                cur = self._unwritten.get(d["id"])
                if cur is not None and cur[0] <= b.seq:
                    del self._unwritten[d["id"]]
            # no longer queued: a newer list supersedes nothing of it (it was counted as superseded
            # on every tick, the writer keeping up or not)
            if self._newest_procs is b:
                self._newest_procs = None
            if self._newest_jobs is b:
                self._newest_jobs = None
            for key in [k for k, v in self._newest_fr.items() if v is b]:
                del self._newest_fr[key]

    def submit_flush(self) -> None:
        with self._lock:
            self._flush()
        if self.pending:
            time.sleep(0.2)

    def _failed(self, e: Exception) -> None:
        self.healthy = False
        self.write_failures_total += 1
        self.last_error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if time.time() - self._last_log > 60:
            self._last_log = time.time()
            log.error("store write failed (%d batches queued, will retry): %s", len(self.pending), self.last_error)

    def _flush(self) -> None:
        while len(self.pending) > MAX_PENDING:  # bounded: the oldest go first
            self._forget(self.pending.popleft())
            self.dropped += 1
        if self._rows_stale:
            self._rows_stale = False
            self._forget_rows()
        while self.pending:
            b = self.pending[0]
            try:
                if not self._migrated:
                    self._upgrade(self.url)
                    self._migrated = True
                if not self.node_id:
                    self.node_id = self._node()
                with self.Session.begin() as s:
                    self._write(s, b)
            except (SQLAlchemyError, OSError) as e:
                self._forget_rows()  # rolled back: what it remembered writing is not there
                self._failed(e)
                return
            except Exception as e:  # noqa: BLE001 - a batch no database takes (a bug, hostile data)
                # retried it would fail for ever and end the writer thread: dropped and counted instead
                self._forget_rows()
                log.exception("store: a batch could not be written and is dropped: %s", e)
                self.write_failures_total += 1
                self.dropped += 1
                self._forget(self.pending.popleft())
                continue
            self._forget(self.pending.popleft())
            if not self.healthy:
                log.warning("store writes work again; catching up (%d batches queued)", len(self.pending))
            self.healthy, self.last_error = True, None
        self._flush_acks()

    def _flush_acks(self) -> None:
        with self._overlay_lock:
            acks = dict(self._acks)
        for iid, t in acks.items():
            try:
                with self.Session.begin() as s:
                    found = self._ack_row(s, iid, t) is not None
            except (SQLAlchemyError, OSError) as e:
                self._failed(e)
                return
            with self._overlay_lock:
                if found or iid not in self._unwritten:  # an ack of an incident still queued waits for its row
                    self._acks.pop(iid, None)

    def _write(self, s: Session, b: Batch) -> None:
        self._write_incidents(s, b)
        if b.changes:
            s.execute(insert(STATE_CHANGES), [
                {"node_id": self.node_id, "t": c["t"], "pid": c["pid"], "rank": c.get("rank"), "job": c.get("job"),
                 "state": c["state"], "reason": redact_text(c["reason"])} for c in b.changes])
        touch = {k: b.t - at >= self.touch_every_s or b.t < at for k, at in self._touched_at.items()}
        beat = touch["nodes"] or self.shared and (b.t - self._beat_at >= self.heartbeat_s or b.t < self._beat_at)
        procs, jobs = b.processes, b.jobs  # read once: a newer batch queued meanwhile may take them
        written = {"nodes"}
        if procs is not None:
            self._write_processes(s, procs, b.t, touch["processes"])
            written.add("processes")
        if jobs is not None:
            self._write_jobs(s, jobs, b.t, touch["jobs"])
            written.add("jobs")
        if b.gpus is not None:
            self._write_gpus(s, b.gpus, b.t, touch["gpus"])
            written.add("gpus")
        with self._overlay_lock:  # a newer batch queued meanwhile may take some
            fr = dict(b.fr)
        if fr and self.shared:
            self._write_fr(s, fr)
        for k in written:
            if touch[k]:
                self._touched_at[k] = b.t
        if beat:
            self._beat_at = b.t
            s.execute(update(NODES).where(NODES.c.id == self.node_id).values(last_seen=b.t))

    def _write_incidents(self, s: Session, b: Batch) -> None:
        for d in b.incidents:
            family = FAMILY.get(d["kind"], d["kind"])
            open_key = f"{d['job']}/{family}"[:300] if self.shared and d["job"] in b.spanning and \
                d.get("resolved_at") is None else None
            inc = s.get(m.Incident, self._alias.get(d["id"], d["id"]))
            if inc is not None and inc.node_id != self.node_id and d["id"] not in self._alias and inc.job != d["job"]:
                # another node's incident under this id (numbered apart by node id % ID_STRIDE, so only
                # past ID_STRIDE nodes): this one goes under a free id of this node's own
                self._alias[d["id"]] = self._free_id(s)
                inc = None
            if inc is None and open_key is not None:
                inc = self._join(s, d, open_key)
            if inc is not None and inc.node_id != self.node_id:
                if not self._stale(s, inc.node_id, b.t):
                    self._note_join(inc, d, b.t)
                    continue  # the node that opened it tells the story while it reports
                # that node stopped reporting: this one carries on, keeping what the row already says
                before, opened = list(inc.timeline or []), inc.opened_at
                inc.node_id = self.node_id
                self._fill_incident(inc, d, family, open_key)
                inc.opened_at = min(opened, inc.opened_at) if opened is not None and inc.opened_at is not None else opened
                inc.timeline = [*before, {"t": round(b.t, 3), "event": f"{self.hostname} took over: the node that "
                                          "opened it stopped reporting"}]
                continue
            if inc is None:
                try:
                    with s.begin_nested():  # a savepoint: another node may take the open_key first
                        inc = m.Incident(id=self._alias.get(d["id"], d["id"]), node_id=self.node_id, open_key=open_key)
                        self._fill_incident(inc, d, family, open_key)
                        s.add(inc)
                        s.flush()
                except IntegrityError:
                    joined = self._join(s, d, open_key) if open_key is not None else None
                    if joined is None:
                        raise
                    self._note_join(joined, d, b.t)
                continue
            self._fill_incident(inc, d, family, open_key)

    def _free_id(self, s: Session) -> int:
        top = int(s.scalar(select(func.max(m.Incident.id))) or 0) + 1
        return top + (self.node_id - top) % ID_STRIDE

    def _join(self, s: Session, d: dict[str, Any], open_key: str) -> m.Incident | None:
        """Another node's open incident of the same job and family: this node's becomes its alias."""
        row = s.scalar(select(m.Incident).where(m.Incident.open_key == open_key))
        if row is not None and row.node_id != self.node_id:
            self._alias[d["id"]] = row.id
            return row
        return None

    def _note_join(self, inc: m.Incident, d: dict[str, Any], t: float) -> None:
        if d["id"] in self._joined:
            return
        self._joined.add(d["id"])
        inc.timeline = [*(inc.timeline or []), {"t": round(t, 3), "event": f"also seen by {self.hostname}: "
                                                f"{redact_text(d.get('summary') or '')[:300]}"}]

    def _stale(self, s: Session, node_id: int, t: float) -> bool:
        last = s.scalar(select(NODES.c.last_seen).where(NODES.c.id == node_id))
        return last is None or last < t - self.node_stale_s

    def _fill_incident(self, inc: m.Incident, d: dict[str, Any], family: str, open_key: str | None) -> None:
        for k in ("kind", "severity", "job", "opened_at", "updated_at", "resolved_at", "hang_started_at", "pids",
                  "ranks", "culprit_pids", "culprit_ranks"):
            setattr(inc, k, d.get(k))
        # what is stored outlives the process and is served to anyone with the token: the
        # words and evidence are redacted again here, whatever the analysis already did
        for k in ("summary", "next_step", "evidence", "findings", "timeline", "who"):
            setattr(inc, k, redact_obj(d.get(k)))
        inc.family = family
        inc.status = "open" if d.get("resolved_at") is None else "resolved"
        inc.acked = bool(inc.acked) or bool(d.get("acked"))  # an acknowledgement is never taken back
        if open_key is not None or inc.status == "resolved":
            inc.open_key = open_key

    def _forget_rows(self) -> None:
        """What the store believes is in the processes, jobs and gpus tables is read again from
        the database on the next write: after a failed write (its transaction was rolled back),
        a recreated file, or retention."""
        self._proc_rows.clear()
        self._job_rows.clear()
        self._gpu_rows.clear()
        self._touched_at = dict.fromkeys(self._touched_at, 0.0)
        self._beat_at = 0.0

    def _updated_all(self, s: Session, stmt: Any, rows: list[dict[str, Any]]) -> bool:
        """Run an executemany UPDATE; False when it matched fewer rows than given (a row the
        store remembered is not there any more), where the driver counts them."""
        res = cast(CursorResult[Any], s.execute(stmt, rows))
        if not self.engine.dialect.supports_sane_multi_rowcount or len(rows) == 1 and \
                not self.engine.dialect.supports_sane_rowcount:
            return True
        return res.rowcount == len(rows)

    # The processes, jobs and gpus tables hold one row per thing with its newest state. Most
    # ticks change none of them, and a tick that changes one process's state used to rewrite every
    # row with a SELECT and an UPDATE each. The store remembers what each row holds (as written,
    # before redaction), writes only rows that changed, each kind in one executemany statement,
    # and moves the last_seen of the others every TOUCH_EVERY_S, as the daemon used to.

    def _write_processes(self, s: Session, procs: list[dict[str, Any]], t: float, touch: bool,
                         retry: bool = True) -> None:
        tbl = PROCESSES
        rows = self._proc_rows
        unknown = [p["pid"] for p in procs if p["pid"] not in rows]
        # new processes (and all of them after a start or a recreated file): the newest row of each
        # pid, PIDS_PER_QUERY at a time, always as many: one statement text, whatever their number
        # (SQLite keeps every text it prepared, ~25 KiB each, up to 128 per connection)
        for part in _padded(unknown):
            for r in s.execute(select(tbl.c.pid, tbl.c.first_seen, tbl.c.job, tbl.c.rank, tbl.c.state, tbl.c.since,
                                      tbl.c.reason, tbl.c.world_size, tbl.c.last_progress, tbl.c.waits, tbl.c.reading,
                                      tbl.c.local, tbl.c.gone_at)
                               .where(tbl.c.node_id == self.node_id, tbl.c.pid.in_(part)).order_by(tbl.c.first_seen)):
                # a row marked gone that is listed again is written again (its gone_at cleared)
                rows[r.pid] = (r.first_seen, (r.job, r.rank, r.state, r.since, r.reason, r.world_size, r.last_progress,
                                              r.waits, r.reading, r.local) if r.gone_at is None else (r.job, _GONE))
        new, changed, same, replaced = [], [], [], []
        for p in procs:
            pid, job = p["pid"], p.get("job")
            # the ranks of a job that spans nodes carry what the other nodes diagnose with (their
            # progress moves often: written only for those, so a single node writes as before)
            fleet = "waits" in p
            # last progress moves on every tick of a working rank: written to the heartbeat's
            # resolution, a rank's row changes once a heartbeat, not once a tick
            lp = p.get("last_progress") if fleet else None
            lp = math.floor(lp / self.heartbeat_s) * self.heartbeat_s if lp is not None else None
            vals = (job, p.get("rank"), p.get("state"), p.get("since"), p.get("reason"),
                    p.get("world_size") if fleet else None, lp,
                    p.get("waits") if fleet else None, p.get("reading") if fleet else None,
                    p.get("local") if fleet else None)
            cur = rows.get(pid)
            if cur is not None and cur[1] == vals:
                same.append({"b_pid": pid, "b_first": cur[0]})
                continue
            row = {"job": job, "rank": vals[1], "state": vals[2], "since": vals[3],
                   "reason": redact_text(vals[4]) if vals[4] else vals[4], "world_size": vals[5],
                   "last_progress": vals[6], "waits": vals[7],
                   "reading": redact_text(vals[8]) if vals[8] else vals[8], "local": vals[9], "last_seen": t,
                   "gone_at": None}
            if cur is None or cur[1][0] != job:  # a pid seen again in another job is another process
                new.append(dict(row, node_id=self.node_id, pid=pid, first_seen=t))
                if cur is not None and cur[1][1] is not _GONE:  # the row of the one before is gone
                    replaced.append({"b_pid": pid, "b_first": cur[0]})
                rows[pid] = (t, vals)
            else:
                changed.append(dict(row, b_pid=pid, b_first=cur[0]))
                rows[pid] = (cur[0], vals)
        listed = {p["pid"] for p in procs}
        gone = replaced + [{"b_pid": pid, "b_first": cur[0]} for pid, cur in rows.items() if pid not in listed]
        _keep_only(rows, listed)
        where = (tbl.c.node_id == self.node_id, tbl.c.pid == bindparam("b_pid"), tbl.c.first_seen == bindparam("b_first"))
        if new:
            s.execute(insert(tbl), new)
        ok = True
        if gone:  # no longer listed: the other nodes stop counting it now, not when its last_seen is old
            s.execute(update(tbl).where(*where).values(gone_at=t, last_seen=t), gone)
        if changed:
            ok = self._updated_all(s, update(tbl).where(*where).values(
                {k: bindparam(k) for k in ("job", "rank", "state", "since", "reason", "world_size", "last_progress",
                                           "waits", "reading", "local", "last_seen", "gone_at")}), changed)
        if touch and same:
            ok = self._updated_all(s, update(tbl).where(*where).values(last_seen=t), same) and ok
        if not ok and retry:  # a row went from under the store (retention): read them all again
            self._proc_rows.clear()
            self._write_processes(s, procs, t, touch, retry=False)

    def _write_jobs(self, s: Session, jobs: list[dict[str, Any]], t: float, touch: bool, retry: bool = True) -> None:
        tbl = JOBS
        rows = self._job_rows
        unknown = [j["job"] for j in jobs if j["job"] not in rows]
        for part in _padded(unknown):
            for r in s.execute(select(tbl.c.key, tbl.c.name, tbl.c.state, tbl.c.ranks, tbl.c.world_size, tbl.c.identity,
                                      tbl.c.spans_nodes, tbl.c.gone_at, tbl.c.who)
                               .where(tbl.c.node_id == self.node_id, tbl.c.key.in_(part))):
                rows[r.key] = (r.name, r.state, r.ranks, r.world_size, r.identity, r.spans_nodes, r.who) \
                    if r.gone_at is None else (_GONE,)
        new, changed, same = [], [], []
        for j in jobs:
            key = j["job"]
            vals = (j.get("name") or key, j.get("state"), j.get("ranks") or {}, j.get("world_size"), j.get("identity"),
                    j.get("spans_nodes"), redact_obj(j.get("who")) or None)
            cur = rows.get(key, ...)
            if cur == vals:
                same.append({"b_key": key})
                continue
            row = {"name": vals[0], "state": vals[1], "ranks": vals[2], "world_size": vals[3], "identity": vals[4],
                   "spans_nodes": vals[5], "who": vals[6], "last_seen": t, "gone_at": None}
            if cur is ...:
                new.append(dict(row, node_id=self.node_id, key=key, first_seen=t))
            else:
                changed.append(dict(row, b_key=key))
            rows[key] = vals
        listed = {j["job"] for j in jobs}
        gone = [{"b_key": key} for key in rows if key not in listed]
        _keep_only(rows, listed)
        where = (tbl.c.node_id == self.node_id, tbl.c.key == bindparam("b_key"))
        if new:
            s.execute(insert(tbl), new)
        ok = True
        if gone:
            s.execute(update(tbl).where(*where).values(gone_at=t, last_seen=t), gone)
        if changed:
            ok = self._updated_all(s, update(tbl).where(*where).values(
                {k: bindparam(k) for k in ("name", "state", "ranks", "world_size", "identity", "spans_nodes", "who",
                                           "last_seen", "gone_at")}), changed)
        if touch and same:
            ok = self._updated_all(s, update(tbl).where(*where).values(last_seen=t), same) and ok
        if not ok and retry:
            self._job_rows.clear()
            self._write_jobs(s, jobs, t, touch, retry=False)

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

    def _write_gpus(self, s: Session, gpus: list[dict[str, Any]], t: float, touch: bool) -> None:
        tbl = GPUS
        rows = self._gpu_rows
        if any(g["index"] not in rows for g in gpus):
            for idx, uuid, name, mem_total in s.execute(select(tbl.c.index, tbl.c.uuid, tbl.c.name, tbl.c.mem_total)
                                                        .where(tbl.c.node_id == self.node_id)):
                rows[idx] = (uuid, name, mem_total)
        new, changed, same = [], [], []
        for g in gpus:
            vals = (g.get("uuid"), g.get("name"), g.get("mem_total"))
            cur = rows.get(g["index"], ...)
            if cur == vals:
                same.append({"b_index": g["index"]})
            else:
                row = {"uuid": vals[0], "name": vals[1], "mem_total": vals[2], "last_seen": t}
                if cur is ...:
                    new.append(dict(row, node_id=self.node_id, index=g["index"]))
                else:
                    changed.append(dict(row, b_index=g["index"]))
                rows[g["index"]] = vals
            self._gpu_minute(s, g, t)
        where = (tbl.c.node_id == self.node_id, tbl.c.index == bindparam("b_index"))
        if new:
            s.execute(insert(tbl), new)
        if changed:
            s.execute(update(tbl).where(*where).values({k: bindparam(k) for k in ("uuid", "name", "mem_total",
                                                                                 "last_seen")}), changed)
        if touch and same:
            s.execute(update(tbl).where(*where).values(last_seen=t), same)

    def _gpu_minute(self, s: Session, g: dict[str, Any], t: float) -> None:
        """Downsample GPU readings to one row per GPU per minute (written when the minute ends)."""
        minute = int(t // 60)
        key = (g["index"], minute)
        acc = self._gpu_acc.setdefault(key, [])
        acc.append((g.get("util_gpu"), (g.get("gpm") or {}).get("SM_UTIL"), g.get("power_w"), g.get("mem_used")))
        for (idx, mn) in [k for k in self._gpu_acc if k[1] < minute]:
            vals = self._gpu_acc.pop((idx, mn))

            def mean(i: int, vals: list[Any] = vals) -> float | None:
                xs = [v[i] for v in vals if v[i] is not None]
                return sum(xs) / len(xs) if xs else None
            exists = s.scalar(select(m.GpuMinute.id).where(m.GpuMinute.node_id == self.node_id,
                                                           m.GpuMinute.gpu_index == idx, m.GpuMinute.minute == mn))
            if exists is None:
                s.add(m.GpuMinute(node_id=self.node_id, gpu_index=idx, minute=mn, util=mean(0), sm=mean(1),
                                  power_w=mean(2), mem_used=mean(3)))

    def retention(self, days: float, now: float | None = None) -> int:
        """Delete history older than ``days``; open incidents are kept whatever their age."""
        cutoff = (now or time.time()) - days * 86400
        try:
            with self.Session.begin() as s:
                n = 0
                for stmt in (delete(m.StateChange).where(m.StateChange.t < cutoff),
                             delete(m.GpuMinute).where(m.GpuMinute.minute < int(cutoff // 60)),
                             delete(m.Incident).where(m.Incident.status == "resolved", m.Incident.resolved_at < cutoff),
                             delete(m.Process).where(m.Process.last_seen < cutoff),
                             delete(m.FrEntry).where(m.FrEntry.dump_id.in_(select(m.FrRank.id).where(m.FrRank.read_at < cutoff))),
                             delete(m.FrRank).where(m.FrRank.read_at < cutoff),
                             delete(m.Job).where(m.Job.last_seen < cutoff)):
                    n += cast(CursorResult[Any], s.execute(stmt)).rowcount or 0
            self._rows_stale = True  # the writer reads the rows it remembers again
            return int(n)
        except SQLAlchemyError as e:
            log.error("retention failed: %s", e)
            return 0

    # ------------------------------------------------------------------ reading

    def open_incidents(self) -> list[dict[str, Any]]:
        with self.Session() as s:
            rows = s.scalars(select(m.Incident).where(m.Incident.node_id == self.node_id, m.Incident.status == "open"))
            return [incident_row_to_dict(r) for r in rows]

    def max_incident_id(self) -> int:
        with self.Session() as s:
            return int(s.scalar(select(func.max(m.Incident.id))) or 0)

    def _overlay(self) -> dict[int, dict[str, Any]]:
        """The queued incidents as the API shows them (status from resolved_at, acks applied)."""
        with self._overlay_lock:
            if not self._unwritten and not self._acks:
                return {}
            items = [(iid, dict(d)) for iid, (_, d) in self._unwritten.items()]
            acks = dict(self._acks)
        out = {}
        for iid, d in items:
            if iid in self._alias:  # written under another row (another node's, of the same hang): that row says it
                continue
            d["status"] = "open" if d.get("resolved_at") is None else "resolved"
            if iid in acks:
                d["acked"] = True
                d["timeline"] = [*(d.get("timeline") or []), {"t": round(acks[iid], 3), "event": "acked"}]
            d.setdefault("acked", False)
            out[iid] = d
        return out

    def list_incidents(self, status: str | None = None, kind: str | None = None, job: str | None = None,
                       since: float | None = None, limit: int = 50, offset: int = 0) -> tuple[int, list[dict[str, Any]]]:
        q = select(m.Incident)
        if status:
            q = q.where(m.Incident.status == status)
        if kind:
            q = q.where(m.Incident.kind == kind)
        if job:
            q = q.where(m.Incident.job == job)
        if since is not None:
            q = q.where(m.Incident.opened_at >= since)
        overlay = self._overlay()
        queued = [{k: v for k, v in d.items() if k not in LIST_FIELDS} for d in overlay.values()
                  if (not status or d["status"] == status) and (not kind or d.get("kind") == kind)
                  and (not job or d.get("job") == job) and (since is None or (d.get("opened_at") or 0) >= since)]
        if overlay:  # the rows of queued incidents are older than the queue: show the queue's
            q = q.where(m.Incident.id.not_in(list(overlay)))
        with self.Session() as s:
            total = int(s.scalar(select(func.count()).select_from(q.subquery())) or 0)
            # a list shows summaries: leave the (large) evidence, findings and timeline in the table
            q = q.options(defer(m.Incident.evidence), defer(m.Incident.findings), defer(m.Incident.timeline))
            q = q.order_by(m.Incident.opened_at.desc(), m.Incident.id.desc())
            if not queued:
                rows = s.scalars(q.limit(limit).offset(offset))
                return total, [self._acked(incident_row_to_dict(r, with_evidence=False), overlay) for r in rows]
            rows = s.scalars(q.limit(offset + limit))
            merged = [self._acked(incident_row_to_dict(r, with_evidence=False), overlay) for r in rows] + queued
        merged.sort(key=lambda d: (d.get("opened_at") or 0, d["id"]), reverse=True)
        return total + len(queued), merged[offset:offset + limit]

    def _acked(self, d: dict[str, Any], overlay: dict[int, dict[str, Any]]) -> dict[str, Any]:
        with self._overlay_lock:
            t = self._acks.get(d["id"])
        if t is not None and not d.get("acked"):
            d["acked"] = True
            if "timeline" in d:
                d["timeline"] = [*(d["timeline"] or []), {"t": round(t, 3), "event": "acked"}]
        return d

    def get_incident(self, iid: int) -> dict[str, Any] | None:
        overlay = self._overlay()
        if iid in overlay:
            return overlay[iid]
        with self.Session() as s:
            # this node's id of a hang it wrote under another row (the metrics and the analyzer name
            # it so): that row
            r = s.get(m.Incident, self._alias.get(iid, iid))
            return self._acked(incident_row_to_dict(r), overlay) if r is not None else None

    def _ack_row(self, s: Session, iid: int, t: float) -> dict[str, Any] | None:
        r = s.get(m.Incident, iid)
        if r is None:
            return None
        if not r.acked:
            r.acked, r.acked_at = True, t
            r.timeline = [*(r.timeline or []), {"t": round(t, 3), "event": "acked"}]
        return incident_row_to_dict(r)

    def ack(self, iid: int, t: float | None = None) -> dict[str, Any] | None:
        """Acknowledge an incident; None when there is no such incident. While the store is degraded
        (or the incident is still queued) the ack is queued too and shows at once in every read."""
        t = t or time.time()
        iid = self._alias.get(iid, iid)  # a hang this node wrote under another row: that row is acked
        with self._overlay_lock:
            queued = iid in self._unwritten
        if not queued and self.healthy:
            try:
                with self.Session.begin() as s:
                    return self._ack_row(s, iid, t)
            except (SQLAlchemyError, OSError) as e:
                log.warning("ack of incident %d queued: %s", iid, str(e).splitlines()[0][:200])
        try:
            exists = self.get_incident(iid) is not None
        except SQLAlchemyError:
            exists = queued
        if not exists:
            return None
        with self._overlay_lock:
            self._acks.setdefault(iid, t)
        return self.get_incident(iid)

    def timeline(self, pid: int | None = None, since: float | None = None, limit: int = 500) -> list[dict[str, Any]]:
        q = select(m.StateChange)
        if pid is not None:
            q = q.where(m.StateChange.pid == pid)
        if since is not None:
            q = q.where(m.StateChange.t >= since)
        with self.Session() as s:
            rows = s.scalars(q.order_by(m.StateChange.t.desc()).limit(limit))
            return [{"t": r.t, "pid": r.pid, "rank": r.rank, "job": r.job, "state": r.state, "reason": r.reason}
                    for r in rows][::-1]

    def jobs(self) -> list[dict[str, Any]]:
        with self.Session() as s:
            rows = s.scalars(select(m.Job).where(m.Job.node_id == self.node_id).order_by(m.Job.last_seen.desc()).limit(200))
            return [{"job": r.key, "name": r.name, "state": r.state, "ranks": r.ranks, "first_seen": r.first_seen,
                     "last_seen": r.last_seen} for r in rows]

    # ------------------------------------------------------------------ the fleet (a shared database)

    def _current(self, tbl: Table, now: float) -> list[Any]:
        """Rows a node still lists, of a node heard from within NODE_FORGET_S: not marked gone (a
        node marks what it stops listing), and moved within a touch of the node's own heartbeat
        (what went away while its hangd was down, or in a write that failed, stops moving)."""
        return [tbl.c.gone_at.is_(None), tbl.c.last_seen >= NODES.c.last_seen - TOUCH_EVERY_S - 2 * self.heartbeat_s - 1,
                NODES.c.last_seen >= now - NODE_FORGET_S]

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
             .where(tbl.c.job.in_(sorted(set(jobs))), tbl.c.node_id != self.node_id, *self._current(tbl, now)))
        with self.Session() as s:
            return [RemoteRank(job=r.job, node=r.hostname, rank=r.rank, pid=r.pid, state=r.state, reason=r.reason,
                               waits=r.waits, last_progress=r.last_progress, reported_at=r.reported_at, reading=r.reading,
                               local=r.local)
                    for r in s.execute(q)]

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
            for part in _padded([h.id for h in new]):
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
        _keep_only(cache, {h.id for h in heads})
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
            done = [x for x in (said if isinstance(said, int) and not isinstance(said, bool) and said >= 0 else None,
                                g["done"].seq if g["done"] is not None else None) if x is not None]
            ranks.setdefault(h.rank, []).append({
                "node": clean(h.hostname), "pg": clean(pg), "read_at": h.read_at,
                "seq": last.seq if last else None, "op": clean(last.op) if last else None,
                "sizes": clean(last.input_sizes) if last else None, "dtypes": clean(last.input_dtypes) if last else None,
                "state": clean(last.state) if last else None, "completed": last.completed if last else None,
                "completed_seq": max(done) if done else None, "behind": None,
                "p2p": {"seq": p2p.p2p_seq, "op": clean(p2p.op), "state": clean(p2p.state), "completed": p2p.completed}
                if p2p else None})
        # a rank that never entered the collective its peers are in shows as behind them
        furthest: dict[str, int] = {}
        for x in (x for xs in ranks.values() for x in xs if x["seq"] is not None):
            furthest[x["pg"]] = max(furthest.get(x["pg"], x["seq"]), x["seq"])
        for x in (x for xs in ranks.values() for x in xs if x["seq"] is not None):
            x["behind"] = furthest[x["pg"]] - x["seq"]
        out["ranks"] = {str(r): ranks[r] for r in sorted(ranks)}
        seen: set[str] = set()
        for iid, findings in sorted(found):
            for f in findings or []:
                if not isinstance(f, dict) or f.get("source") != "flight_recorder" or str(f.get("message")) in seen:
                    continue
                seen.add(str(f.get("message")))
                out["findings"].append(redact_obj({"incident": iid, "kind": f.get("kind"), "pg": f.get("pg"),
                                                   "seq": f.get("seq"), "message": str(f.get("message") or "")}))
        # "all ranks entered #61 and none completed it" was said over one node's ranks before the
        # other nodes' dumps came; "rank 3 never entered #61" over all of them overrules it
        missing = {(f["pg"], f["seq"]) for f in out["findings"] if f["kind"] == "missing_rank"}
        out["findings"] = [f for f in out["findings"] if f["kind"] != "stuck" or (f["pg"], f["seq"]) not in missing]
        return out

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
              .join(NODES, NODES.c.id == J.c.node_id).where(J.c.spans_nodes.is_not(None), *self._current(J, now)))
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
                  .join(NODES, NODES.c.id == P.c.node_id).where(P.c.job.in_(sorted(out)), *self._current(P, now)))
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

    def gpu_history(self, index: int, since: float) -> list[dict[str, Any]]:
        with self.Session() as s:
            rows = s.scalars(select(m.GpuMinute).where(m.GpuMinute.gpu_index == index, m.GpuMinute.minute >= int(since // 60))
                             .order_by(m.GpuMinute.minute))
            return [{"t": r.minute * 60, "util": r.util, "sm": r.sm, "power_w": r.power_w, "mem_used": r.mem_used} for r in rows]

    def size_bytes(self) -> int | None:
        if self.engine.dialect.name == "sqlite" and self.engine.url.database:
            p = self.engine.url.database
            return sum(os.path.getsize(x) for x in (p, p + "-wal") if os.path.exists(x))
        return None

