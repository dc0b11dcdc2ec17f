"""The writer queue and its overlay. Writes come from the loop thread in batches; a batch that
fails (database locked, disk full, read-only) stays queued, bounded, and is retried on the next
tick, so hangd keeps diagnosing and serving and catches up when the database comes back. While
batches are queued, reads overlay the queued incidents (and acknowledgements) on the database's
rows, so every endpoint tells the same story. The writer thread also reads what the other nodes
of a shared database report (``remote_ranks``, ``remote_dumps``) after its writes: a database
that is slow or gone must never stall the sampling loop, which only takes what was last read.
A SQLite file removed or replaced under hangd is noticed here and made again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from hangd.snapshot import RemoteDump, RemoteRank
from hangd.store import models as m
from hangd.store.base import NODES, Batch, StoreBase
from hangd.store.lock import InstanceLock
from hangd.store.rows import RowMirror, gpu_items, job_items, process_items

log = logging.getLogger("hangd.store")
MAX_PENDING = 20_000
FILE_CHECK_EVERY_S = 2.0
LOCK_CHECK_EVERY_S = 10.0


class WriterQueue(StoreBase):
    """Queued batches, the thread that writes them, and what reads see of them meanwhile."""

    url: str
    path: str | None
    lock: InstanceLock | None
    pending: deque[Batch]
    dropped: int
    superseded: int
    last_error: str | None
    write_failures_total: int
    recreated: int
    needs_rewrite: bool
    remote_read_failures: int
    touch_every_s: float
    _upgrade: Callable[[str], None]
    _migrated: bool
    _lock: threading.Lock
    _mirrors: dict[str, RowMirror]  # processes, jobs, gpus
    _touched_at: dict[str, float]
    _beat_at: float
    _seq: int
    _newest_procs: Batch | None
    _newest_jobs: Batch | None
    _newest_fr: dict[tuple[str, int], Batch]
    _remote_jobs: set[str]
    _remote: tuple[float, list[RemoteRank]] | None
    _remote_dumps: tuple[float, list[RemoteDump]] | None
    _remote_read: tuple[float, list[str]]
    _ident: tuple[int, int] | None
    _last_file_check: float
    _last_lock_check: float
    _writer: threading.Thread | None
    _wake: threading.Event
    _writer_stop: threading.Event

    def _node(self) -> int:
        """This node's row (made at the first write): its id."""
        now = time.time()
        with self.Session.begin() as s:
            n = s.scalar(select(m.Node).where(m.Node.hostname == self.hostname))
            if n is None:
                n = m.Node(hostname=self.hostname, first_seen=now, last_seen=now)
                s.add(n)
                s.flush()
            return int(n.id)

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
            self._write_changes(s, b.changes)
        touch = {k: b.t - at >= self.touch_every_s or b.t < at for k, at in self._touched_at.items()}
        beat = touch["nodes"] or self.shared and (b.t - self._beat_at >= self.heartbeat_s or b.t < self._beat_at)
        procs, jobs = b.processes, b.jobs  # read once: a newer batch queued meanwhile may take them
        written = {"nodes"}
        if procs is not None:
            self._mirrors["processes"].write(s, self.node_id, process_items(procs, self.heartbeat_s), b.t,
                                             touch["processes"])
            written.add("processes")
        if jobs is not None:
            self._mirrors["jobs"].write(s, self.node_id, job_items(jobs), b.t, touch["jobs"])
            written.add("jobs")
        if b.gpus is not None:
            self._mirrors["gpus"].write(s, self.node_id, gpu_items(b.gpus), b.t, touch["gpus"])
            self._gpu_minutes(s, b.gpus, b.t)
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

    def _forget_rows(self) -> None:
        """What the store believes is in the processes, jobs and gpus tables is read again from
        the database on the next write: after a failed write (its transaction was rolled back),
        a recreated file, or retention."""
        for mirror in self._mirrors.values():
            mirror.forget()
        self._touched_at = dict.fromkeys(self._touched_at, 0.0)
        self._beat_at = 0.0

    # ------------------------------------------------------------------ the overlay

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


    def _acked(self, d: dict[str, Any], overlay: dict[int, dict[str, Any]]) -> dict[str, Any]:
        with self._overlay_lock:
            t = self._acks.get(d["id"])
        if t is not None and not d.get("acked"):
            d["acked"] = True
            if "timeline" in d:
                d["timeline"] = [*(d["timeline"] or []), {"t": round(t, 3), "event": "acked"}]
        return d

