"""What the parts of the store share. ``Store`` (db.py) is made of one class per job (the writer
queue, incidents, the history tables, the fleet's reads, flight-recorder rows, retention), each
in its own module; this is what they read of one another, set by ``Store.__init__``."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Engine, Table, orm

from hangd.snapshot import RemoteDump, RemoteRank
from hangd.store import models as m

ID_STRIDE = 1024  # incident ids of a shared database: node_id % ID_STRIDE, then every ID_STRIDE
HEARTBEAT_S = 2.0  # a shared database: how often a node's last_seen moves (its one row)
NODE_STALE_S = 15.0  # a shared database: a node whose last_seen is older has stopped reporting
NODE_FORGET_S = 3600.0  # a node silent longer than this is not listed with a job any more
TOUCH_EVERY_S = 10.0  # how stale the last_seen of an unchanged process, job or GPU row may get
# a node's row (its name, and when it last reported), joined by every read of the fleet
NODES = cast(Table, m.Node.__table__)


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


class StoreBase:
    url: str
    shared: bool  # a database that a fleet shares (PostgreSQL): rows of many nodes
    hostname: str
    node_id: int
    engine: Engine
    Session: orm.sessionmaker[orm.Session]
    heartbeat_s: float
    node_stale_s: float
    healthy: bool
    _last_log: float
    _rows_stale: bool  # retention deleted rows: the row mirrors read them again
    # this node's incident id -> the id of the row it joined (another node opened it first)
    _alias: dict[int, int]
    # queued but not yet written: incident id -> (seq of its newest batch, its dict); acks likewise
    _overlay_lock: threading.Lock
    _unwritten: dict[int, tuple[int, dict[str, Any]]]
    _acks: dict[int, float]

    # what one part calls of another (defined there)
    def _write_incidents(self, s: orm.Session, b: Batch) -> None:
        raise NotImplementedError

    def _write_changes(self, s: orm.Session, changes: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def _gpu_minutes(self, s: orm.Session, gpus: list[dict[str, Any]], t: float) -> None:
        raise NotImplementedError

    def _write_fr(self, s: orm.Session, fr: dict[tuple[str, int], tuple[float, Any]]) -> None:
        raise NotImplementedError

    def _overlay(self) -> dict[int, dict[str, Any]]:
        raise NotImplementedError

    def _acked(self, d: dict[str, Any], overlay: dict[int, dict[str, Any]]) -> dict[str, Any]:
        raise NotImplementedError

    def _ack_row(self, s: orm.Session, iid: int, t: float) -> dict[str, Any] | None:
        raise NotImplementedError

    def remote_ranks(self, jobs: list[str], now: float | None = None) -> list[RemoteRank]:
        raise NotImplementedError

    def remote_dumps(self, jobs: list[str], now: float | None = None) -> list[RemoteDump]:
        raise NotImplementedError
